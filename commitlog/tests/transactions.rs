//! Transactions in the log: markers, the last stable offset, the aborted-transactions
//! index (`.txnindex`) across rolls, a clean close, a crash, damage, truncation,
//! retention and replication.

use std::time::Duration;

use fjord_log::{AbortedTxn, Error, Log, LogConfig, Offset, TxnVerification};
use fjord_record::BatchBuilder;

/// A batch of `n` records from producer `pid`, transactional or not.
fn batch(pid: i64, epoch: i16, seq: i32, n: usize, transactional: bool) -> Vec<u8> {
    let mut b = BatchBuilder::new(1_000).producer(pid, epoch, seq);
    if transactional {
        b = b.transactional();
    }
    for i in 0..n {
        b.append(1_000, None, Some(format!("p{pid}-s{}", seq + i as i32).as_bytes()), &[]);
    }
    b.build_vec()
}

fn txn(log: &Log, pid: i64, seq: i32, n: usize) -> Offset {
    log.append(&mut batch(pid, 0, seq, n, true), 0).unwrap().base_offset
}

fn tiny() -> LogConfig {
    LogConfig {
        segment_bytes: 400,
        min_segment_bytes: 400,
        index_interval_bytes: 100,
        file_delete_delay: Duration::ZERO,
        ..LogConfig::default()
    }
}

/// What a read_committed consumer of the whole log is told: (producer, first offset).
fn aborted(log: &Log) -> Vec<(i64, Offset)> {
    let mut v: Vec<(i64, Offset)> = log
        .aborted_transactions(log.log_start_offset(), log.log_end_offset())
        .unwrap()
        .into_iter()
        .map(|a| (a.producer_id, a.first_offset))
        .collect();
    v.sort_unstable();
    v
}

fn files(log: &Log, suffix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(log.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(suffix))
        .collect();
    v.sort();
    v
}

#[test]
fn the_last_stable_offset_waits_for_open_transactions_and_replicated_markers() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    assert_eq!(txn(&log, 1, 0, 2), 0);
    log.append(&mut batch(-1, -1, -1, 1, false), 0).unwrap();
    assert_eq!(txn(&log, 2, 0, 1), 3);
    log.set_high_watermark(log.log_end_offset());
    assert_eq!(log.last_stable_offset(), 0);
    assert_eq!(log.open_transactions(), vec![(0, 1), (3, 2)]);
    // Producer 1 aborts at 4: stable up to producer 2's first offset once replicated.
    let abort = log.append_marker(1, 0, 0, false, 0).unwrap();
    assert_eq!((abort.base_offset, abort.record_count), (4, 1));
    assert_eq!(log.last_stable_offset(), 0, "the marker is above the high watermark");
    log.set_high_watermark(5);
    assert_eq!(log.last_stable_offset(), 3);
    assert_eq!(aborted(&log), vec![(1, 0)]);
    // Producer 2 commits: nothing undecided, the LSO is the high watermark.
    log.append_marker(2, 0, 0, true, 0).unwrap();
    log.set_high_watermark(log.log_end_offset());
    assert_eq!(log.last_stable_offset(), 6);
    assert_eq!(aborted(&log), vec![(1, 0)], "a commit is not in the index");
    assert!(log.open_transactions().is_empty());
    // The search by range: from 5 on, producer 1's abort (marker 4) is behind.
    assert!(log.aborted_transactions(5, 6).unwrap().is_empty());
    assert_eq!(
        log.aborted_transactions(1, 2).unwrap(),
        vec![AbortedTxn { producer_id: 1, first_offset: 0, last_offset: 4, last_stable_offset: 3 }]
    );
}

#[test]
fn fenced_markers_and_stray_batches_leave_the_log_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    log.append(&mut batch(7, 2, 0, 1, true), 0).unwrap();
    log.append_marker(7, 2, 5, false, 0).unwrap();
    let end = log.log_end_offset();
    let size = log.size_bytes();
    // (The marker, stamped now, rolled a segment: the batches are from 1970.)
    let index_file = dir.path().join(&files(&log, ".txnindex")[0]);
    let index = std::fs::read(&index_file).unwrap();
    assert!(matches!(log.append_marker(7, 1, 5, true, 0), Err(Error::InvalidProducerEpoch { epoch: 1, current: 2, .. })));
    assert!(matches!(
        log.append_marker(7, 2, 4, true, 0),
        Err(Error::TransactionCoordinatorFenced { coordinator_epoch: 4, current: 5, .. })
    ));
    // Inside an open transaction a producer's plain batch is refused.
    log.append(&mut batch(7, 2, 1, 1, true), 0).unwrap();
    let (end, size) = (end + 1, log.size_bytes().max(size));
    assert!(matches!(log.append(&mut batch(7, 2, 2, 1, false), 0), Err(Error::InvalidTxnState { producer_id: 7, .. })));
    assert_eq!((log.log_end_offset(), log.size_bytes()), (end, size));
    assert_eq!(std::fs::read(&index_file).unwrap(), index);
    // A marker for a producer the log never saw is written (it records the epoch).
    log.append_marker(99, 0, 5, true, 0).unwrap();
    assert!(matches!(log.append(&mut batch(99, -1, 0, 1, true), 0), Err(Error::InvalidProducerEpoch { .. })));
}

/// Appends `bytes` as a leader checking transactions with `verification`.
fn verified_append(log: &Log, mut bytes: Vec<u8>, verification: TxnVerification) -> Result<Offset, Error> {
    log.append_visiting(&mut bytes, 0, None, verification).map(|info| info.base_offset)
}

#[test]
fn a_transaction_opens_only_under_its_producers_current_verification_guard() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    let unverified = |log: &Log, pid, seq| verified_append(log, batch(pid, 0, seq, 1, true), TxnVerification::Required(None));
    // Without a verification a transactional batch opens nothing, and nothing is written.
    assert!(matches!(unverified(&log, 7, 0), Err(Error::TransactionNotVerified { producer_id: 7 })));
    assert_eq!((log.log_end_offset(), log.open_transactions()), (0, vec![]));
    // Under the guard it opens the transaction; the next batches need none.
    let guard = log.start_txn_verification(7).unwrap().expect("no transaction open yet");
    assert_eq!(log.start_txn_verification(7).unwrap(), Some(guard), "a second request of the transaction shares it");
    assert_eq!(verified_append(&log, batch(7, 0, 0, 1, true), TxnVerification::Required(Some(guard))).unwrap(), 0);
    assert_eq!(log.start_txn_verification(7).unwrap(), None);
    assert_eq!(unverified(&log, 7, 1).unwrap(), 1);
    // The guard was spent by the first batch: after the marker it opens nothing.
    log.append_marker(7, 0, 0, true, 0).unwrap();
    assert!(matches!(
        verified_append(&log, batch(7, 0, 2, 1, true), TxnVerification::Required(Some(guard))),
        Err(Error::TransactionNotVerified { .. })
    ));
    // A marker appended while a verification is under way (an abort at the timeout)
    // makes its answer stale: the guard no longer opens the transaction.
    let stale = log.start_txn_verification(7).unwrap().unwrap();
    log.append_marker(7, 0, 0, false, 0).unwrap();
    let end = log.log_end_offset();
    assert!(matches!(
        verified_append(&log, batch(7, 0, 2, 1, true), TxnVerification::Required(Some(stale))),
        Err(Error::TransactionNotVerified { .. })
    ));
    assert_eq!(log.log_end_offset(), end);
    let fresh = log.start_txn_verification(7).unwrap().unwrap();
    assert_ne!(fresh, stale);
    // One producer's guard opens nothing for another, and a cancelled one nothing at all.
    assert!(matches!(
        verified_append(&log, batch(8, 0, 0, 1, true), TxnVerification::Required(Some(fresh))),
        Err(Error::TransactionNotVerified { producer_id: 8 })
    ));
    // A request whose verification failed leaves the guard to another that took it too.
    assert_eq!(log.start_txn_verification(7).unwrap(), Some(fresh));
    log.cancel_txn_verification(7, fresh);
    assert_eq!(log.start_txn_verification(7).unwrap(), Some(fresh));
    log.cancel_txn_verification(7, fresh);
    log.cancel_txn_verification(7, fresh);
    assert!(matches!(
        verified_append(&log, batch(7, 0, 2, 1, true), TxnVerification::Required(Some(fresh))),
        Err(Error::TransactionNotVerified { .. })
    ));
    // Plain and idempotent batches never need one; with verification off nothing does.
    verified_append(&log, batch(9, 0, 0, 1, false), TxnVerification::Required(None)).unwrap();
    verified_append(&log, batch(8, 0, 0, 1, true), TxnVerification::Off).unwrap();
    assert_eq!(log.open_transactions().len(), 1);
}

/// Ten transactions over many small segments, every other one aborted, with a plain
/// batch between: returns the aborted ones as (producer, first offset).
fn mixed(log: &Log) -> Vec<(i64, Offset)> {
    let mut expected = Vec::new();
    for pid in 0..10 {
        let first = txn(log, pid, 0, 2);
        log.append(&mut batch(-1, -1, -1, 1, false), 0).unwrap();
        txn(log, pid, 2, 1);
        let commit = pid % 2 == 0;
        log.append_marker(pid, 0, 0, commit, 0).unwrap();
        if !commit {
            expected.push((pid, first));
        }
    }
    // One left open.
    txn(log, 50, 0, 1);
    log.set_high_watermark(log.log_end_offset());
    expected
}

#[test]
fn the_index_survives_a_clean_close_a_crash_and_damage() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    let expected = mixed(&log);
    assert!(log.segment_count() > 3, "rolls: {}", log.segment_count());
    assert!(files(&log, ".txnindex").len() > 1);
    assert_eq!(aborted(&log), expected);
    let open = log.open_transactions();
    let lso = log.last_stable_offset();
    log.close().unwrap();
    drop(log);
    let reopen = |recovery_point: Offset| {
        let log = Log::open_with_recovery_point(dir.path(), tiny(), recovery_point).unwrap();
        log.set_high_watermark(log.log_end_offset());
        log
    };
    // Clean: from the snapshot at the log end, nothing replayed.
    let log = reopen(0);
    assert_eq!((aborted(&log), log.open_transactions(), log.last_stable_offset()), (expected.clone(), open.clone(), lso));
    let end = log.log_end_offset();
    drop(log);
    // A crash (no close): the unflushed part is replayed and its index rewritten.
    let index_files = files(&reopen(0), ".txnindex");
    for name in &index_files {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    let log = reopen(0);
    assert_eq!((aborted(&log), log.open_transactions(), log.last_stable_offset()), (expected.clone(), open.clone(), lso));
    assert_eq!(files(&log, ".txnindex"), index_files);
    log.close().unwrap();
    drop(log);
    // A torn index below the recovery point (after a clean close) is found and rebuilt.
    let torn = dir.path().join(&index_files[0]);
    std::fs::OpenOptions::new().append(true).open(&torn).map(|mut f| std::io::Write::write_all(&mut f, b"xyz")).unwrap().unwrap();
    let log = reopen(end);
    assert_eq!((aborted(&log), log.open_transactions()), (expected.clone(), open.clone()));
    assert_eq!(std::fs::metadata(&torn).unwrap().len() % 34, 0);
    // Without any snapshot the whole log is replayed.
    log.close().unwrap();
    drop(log);
    for name in files(&reopen(end), ".snapshot") {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    std::fs::remove_file(&torn).unwrap();
    let log = reopen(0);
    assert_eq!((aborted(&log), log.open_transactions(), log.last_stable_offset()), (expected, open, lso));
}

#[test]
fn truncation_reopens_a_transaction_whose_marker_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    let expected = mixed(&log);
    // Cut at the last abort's marker (producer 9's, the log's last marker).
    let last = log.aborted_transactions(0, log.log_end_offset()).unwrap().into_iter().max_by_key(|a| a.last_offset).unwrap();
    log.truncate_to(last.last_offset).unwrap();
    assert_eq!(aborted(&log), expected[..expected.len() - 1]);
    assert_eq!(log.open_transactions(), vec![(last.first_offset, 9)]);
    log.set_high_watermark(log.log_end_offset());
    assert_eq!(log.last_stable_offset(), last.first_offset);
    // The leader's marker comes again, as a follower would fetch it.
    log.append_marker(9, 0, 0, false, 0).unwrap();
    assert_eq!(aborted(&log), expected);
}

#[test]
fn retention_never_passes_an_open_transaction_and_deletes_indexes_with_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    let first = txn(&log, 1, 0, 1);
    for _ in 0..40 {
        log.append(&mut batch(-1, -1, -1, 1, false), 0).unwrap();
    }
    log.set_high_watermark(log.log_end_offset());
    log.update_config(LogConfig { retention_bytes: Some(1), ..tiny() }).unwrap();
    assert_eq!(log.apply_retention(i64::MAX).unwrap(), 0);
    assert_eq!(log.log_start_offset(), first);
    // Once aborted, its segment may go, and the index files with theirs.
    log.append_marker(1, 0, 0, false, 0).unwrap();
    let before = files(&log, ".txnindex");
    assert_eq!(before.len(), 1);
    for _ in 0..20 {
        log.append(&mut batch(-1, -1, -1, 1, false), 0).unwrap();
    }
    log.set_high_watermark(log.log_end_offset());
    assert!(log.apply_retention(i64::MAX).unwrap() > 0);
    assert!(log.log_start_offset() > first);
    assert!(before.iter().all(|name| !dir.path().join(name).exists()), "the index went with its segment");
    assert!(aborted(&log).is_empty());
}

/// DeleteRecords may pass an open transaction's first offset (Kafka bounds it by the high
/// watermark only); the last stable offset is then the log start, never below it (it was
/// the transaction's first offset, under the log start: ListOffsets read_committed and
/// Fetch answered an offset that no longer exists). After a crash the producer state is
/// replayed from the log start, which no longer holds the transaction's first batch: it
/// is known from its first batch still in the log, so the LSO stays between the log start
/// and that batch, and its abort still hides every record of it that is left.
#[test]
fn delete_records_past_an_open_transaction_keeps_the_lso_at_the_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let tp = fjord_record::TopicPartition::new("t", 0);
    let manager = fjord_log::LogManager::open(dir.path(), tiny()).unwrap();
    let log = manager.get_or_create(&tp, tiny()).unwrap();
    assert_eq!(txn(&log, 1, 0, 2), 0);
    for _ in 0..20 {
        log.append(&mut batch(-1, -1, -1, 1, false), 0).unwrap();
    }
    let later = txn(&log, 1, 2, 2);
    assert_eq!(later, 22);
    log.append(&mut batch(-1, -1, -1, 1, false), 0).unwrap();
    log.set_high_watermark(log.log_end_offset());
    assert_eq!(log.last_stable_offset(), 0);
    assert_eq!(log.delete_records_before(10).unwrap(), 10);
    assert_eq!(log.open_transactions(), vec![(0, 1)], "the transaction is still open");
    assert_eq!(log.last_stable_offset(), 10);
    manager.checkpoint().unwrap();
    drop(log);
    drop(manager); // a crash: the checkpoint keeps the start

    let manager = fjord_log::LogManager::open(dir.path(), tiny()).unwrap();
    let log = manager.get(&tp).unwrap();
    assert_eq!(log.log_start_offset(), 10);
    let open = log.open_transactions();
    assert!(open.len() == 1 && open[0].1 == 1 && open[0].0 <= later, "{open:?}");
    assert!((10..=later).contains(&log.last_stable_offset()), "{}", log.last_stable_offset());
    let abort = log.append_marker(1, 0, 0, false, 0).unwrap().base_offset;
    log.set_high_watermark(log.log_end_offset());
    assert_eq!(log.last_stable_offset(), log.log_end_offset());
    let told = log.aborted_transactions(10, log.log_end_offset()).unwrap();
    assert_eq!(told.len(), 1);
    assert!(told[0].producer_id == 1 && told[0].first_offset <= later && told[0].last_offset == abort, "{told:?}");
    manager.close().unwrap();
}

#[test]
fn a_follower_copies_markers_and_builds_the_same_state() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let leader = Log::open(leader_dir.path(), tiny()).unwrap();
    let follower = Log::open(follower_dir.path(), tiny()).unwrap();
    let expected = mixed(&leader);
    let mut at = 0;
    while at < leader.log_end_offset() {
        let bytes = leader.read_bytes(at, 1 << 20, None, false).unwrap();
        follower.append_replicated(&bytes).unwrap();
        at = follower.log_end_offset();
    }
    follower.set_high_watermark(follower.log_end_offset());
    assert_eq!(aborted(&follower), expected);
    assert_eq!(follower.open_transactions(), leader.open_transactions());
    assert_eq!(follower.last_stable_offset(), leader.last_stable_offset());
    assert_eq!(files(&follower, ".txnindex"), files(&leader, ".txnindex"));
    // The follower, now leader, knows the producers' epochs and open transactions.
    assert!(matches!(follower.append(&mut batch(50, 0, 1, 1, false), 1), Err(Error::InvalidTxnState { .. })));
}

/// A keyed batch of one record `key=value` from producer `pid` (transactional or not).
fn keyed(pid: i64, seq: i32, transactional: bool, key: &str, value: &str) -> Vec<u8> {
    let mut b = BatchBuilder::new(1_000).producer(pid, 0, seq);
    if transactional {
        b = b.transactional();
    }
    b.append(1_000, Some(key.as_bytes()), Some(value.as_bytes()), &[]);
    b.build_vec()
}

#[test]
fn compaction_drops_aborted_records_keeps_markers_and_stops_at_the_lso() {
    use fjord_log::{Cleaner, CleanerConfig, CleanupPolicy};
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { cleanup_policy: CleanupPolicy::Compact, ..tiny() };
    let log = Log::open(dir.path(), config).unwrap();
    // k=good committed, then k=bad aborted (it must not shadow k=good), filler to roll
    // segments, then k=open in a transaction still open (above the LSO: untouched).
    log.append(&mut keyed(1, 0, true, "k", "good"), 0).unwrap();
    log.append_marker(1, 0, 0, true, 0).unwrap();
    log.append(&mut keyed(2, 0, true, "k", "bad"), 0).unwrap();
    log.append(&mut keyed(2, 1, true, "j", "bad"), 0).unwrap();
    log.append_marker(2, 0, 0, false, 0).unwrap();
    for i in 0..10 {
        log.append(&mut keyed(-1, -1, false, &format!("f{i}"), "x"), 0).unwrap();
    }
    let open = log.append(&mut keyed(3, 0, true, "k", "open"), 0).unwrap().base_offset;
    for i in 0..10 {
        log.append(&mut keyed(-1, -1, false, &format!("g{i}"), "x"), 0).unwrap();
    }
    log.set_high_watermark(log.log_end_offset());
    assert_eq!(log.last_stable_offset(), open);
    Cleaner::new(CleanerConfig::default()).clean(&log, 10_000).unwrap();
    let mut values = Vec::new();
    let mut markers = 0;
    let mut at = log.log_start_offset();
    while at < log.log_end_offset() {
        let bytes = log.read_bytes(at, 1 << 20, None, true).unwrap();
        for b in fjord_record::batch::batches(&bytes) {
            let (h, b) = b.unwrap();
            at = h.next_offset();
            if h.is_control() {
                markers += 1;
                continue;
            }
            for r in fjord_record::Records::new(&b[fjord_record::BATCH_OVERHEAD..], 0) {
                let r = r.unwrap();
                let kv =
                    (String::from_utf8(r.key.unwrap().to_vec()).unwrap(), String::from_utf8(r.value.unwrap().to_vec()).unwrap());
                if kv.0 == "k" || kv.0 == "j" {
                    values.push(kv);
                }
            }
        }
    }
    assert!(log.last_clean().unwrap().records_read > 0, "the cleaner ran");
    assert_eq!(values, vec![("k".to_owned(), "good".to_owned()), ("k".to_owned(), "open".to_owned())]);
    assert_eq!(markers, 2, "markers are kept");
    assert_eq!(aborted(&log), vec![(2, 2)], "the index still names the abort");
    assert_eq!(log.open_transactions(), vec![(open, 3)]);
}

/// Every batch of the log from its start: (offset, producer, control?, key=value of each record).
fn walk(log: &Log) -> Vec<(Offset, i64, bool, Vec<String>)> {
    let mut out = Vec::new();
    let mut at = log.log_start_offset();
    while at < log.log_end_offset() {
        let bytes = log.read_bytes(at, 1 << 20, None, true).unwrap();
        for b in fjord_record::batch::batches(&bytes) {
            let (h, b) = b.unwrap();
            at = h.next_offset();
            let records = if h.is_control() {
                Vec::new()
            } else {
                fjord_record::Records::new(&b[fjord_record::BATCH_OVERHEAD..], 0)
                    .map(|r| {
                        let r = r.unwrap();
                        format!(
                            "{}={}",
                            String::from_utf8_lossy(r.key.unwrap_or_default()),
                            String::from_utf8_lossy(r.value.unwrap_or_default())
                        )
                    })
                    .collect()
            };
            out.push((h.base_offset, h.producer_id, h.is_control(), records));
        }
    }
    out
}

/// Kafka's second pass over markers: a marker goes once no record of its transaction is
/// left (all aborted, or all superseded) and it was first cleaned `delete.retention.ms`
/// ago; never the marker of a transaction with a record left, nor a producer's last
/// marker. After the clean and a reopen (the producer state and the LSO rebuilt from the
/// log) nothing is open, the LSO is the log end, and no aborted record is visible.
#[test]
fn markers_go_after_delete_retention_once_their_transaction_has_no_record_left() {
    use fjord_log::{Cleaner, CleanerConfig, CleanupPolicy};
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { cleanup_policy: CleanupPolicy::Compact, delete_retention: Duration::from_secs(1), ..tiny() };
    let log = Log::open(dir.path(), config).unwrap();
    // Producer 1: k committed, then superseded below (no record left: its marker may go).
    log.append(&mut keyed(1, 0, true, "k", "old"), 0).unwrap();
    let commit_superseded = log.append_marker(1, 0, 0, true, 0).unwrap().base_offset;
    // Producer 2: aborted (no record left once the cleaner drops them: its marker may go).
    log.append(&mut keyed(2, 0, true, "a", "aborted"), 0).unwrap();
    let abort = log.append_marker(2, 0, 0, false, 0).unwrap().base_offset;
    // Producer 4: committed with a key nobody overwrites: its marker stays.
    log.append(&mut keyed(4, 0, true, "m", "kept"), 0).unwrap();
    let commit_kept = log.append_marker(4, 0, 0, true, 0).unwrap().base_offset;
    log.append(&mut keyed(-1, -1, false, "k", "new"), 0).unwrap();
    // Later transactions of 1 and 2: their markers are the producers' last, and stay.
    log.append(&mut keyed(1, 1, true, "z1", "v"), 0).unwrap();
    let last_1 = log.append_marker(1, 0, 0, true, 0).unwrap().base_offset;
    log.append(&mut keyed(2, 1, true, "z2", "v"), 0).unwrap();
    let last_2 = log.append_marker(2, 0, 0, false, 0).unwrap().base_offset;
    for i in 0..12 {
        log.append(&mut keyed(-1, -1, false, &format!("f{i}"), "x"), 0).unwrap();
    }
    log.set_high_watermark(log.log_end_offset());
    let markers = |log: &Log| -> Vec<Offset> { walk(log).into_iter().filter(|b| b.2).map(|b| b.0).collect() };
    let all = vec![commit_superseded, abort, commit_kept, last_1, last_2];
    assert_eq!(markers(&log), all);

    let mut cleaner = Cleaner::new(CleanerConfig::default());
    cleaner.clean(&log, 10_000).unwrap();
    assert_eq!(markers(&log), all, "first cleaned now: kept for delete.retention.ms");
    assert_eq!(log.last_clean().unwrap().markers_removed, 0);
    cleaner.clean(&log, 10_900).unwrap();
    assert_eq!(markers(&log), all, "not yet delete.retention.ms");
    cleaner.clean(&log, 11_000).unwrap();
    assert_eq!(markers(&log), vec![commit_kept, last_1, last_2]);
    assert_eq!(log.last_clean().unwrap().markers_removed, 2);

    let check = |log: &Log| {
        let records: Vec<String> = walk(log).into_iter().flat_map(|b| b.3).collect();
        assert!(records.contains(&"m=kept".to_owned()) && records.contains(&"k=new".to_owned()), "{records:?}");
        assert!(!records.iter().any(|r| r.contains("aborted") || r == "k=old" || r == "z2=v"), "{records:?}");
        assert!(log.open_transactions().is_empty(), "{:?}", log.open_transactions());
        assert_eq!(log.last_stable_offset(), log.log_end_offset());
    };
    check(&log);
    let end = log.log_end_offset();
    drop(log);
    // A crash loses the producer state snapshot: rebuilt from the cleaned log.
    for snapshot in std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()) {
        if snapshot.extension().is_some_and(|e| e == "snapshot") {
            std::fs::remove_file(snapshot).unwrap();
        }
    }
    let log = Log::open(dir.path(), config).unwrap();
    log.set_high_watermark(end);
    check(&log);
    assert_eq!(markers(&log), vec![commit_kept, last_1, last_2]);
}
