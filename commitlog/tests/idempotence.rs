//! Idempotent producer state in the log: duplicates, gaps and fenced epochs on the
//! leader path; followers applying batches unchecked; the state surviving a clean
//! close, a crash, truncation and retention; and a model-based test of all of it.

mod common;

use std::time::Duration;

use common::read_all;
use fjord_log::{Error, Log, LogConfig, Offset, ProducerInfo};
use fjord_record::{BatchBuilder, BatchHeader};
use proptest::prelude::*;

/// A batch of `n` records from producer `pid` at `epoch`, first sequence `seq`.
fn pbatch(pid: i64, epoch: i16, seq: i32, n: usize, ts: i64) -> Vec<u8> {
    let mut b = BatchBuilder::new(ts).producer(pid, epoch, seq);
    for i in 0..n {
        b.append(ts, None, Some(format!("p{pid}-e{epoch}-s{}", seq + i as i32).as_bytes()), &[]);
    }
    b.build_vec()
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

fn snapshots(log: &Log) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(log.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".snapshot"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_retry_is_answered_with_the_original_offsets_and_nothing_is_appended() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    let first = log.append(&mut pbatch(1, 0, 0, 3, 1_000), 0).unwrap();
    let second = log.append(&mut pbatch(1, 0, 3, 2, 1_000), 0).unwrap();
    assert_eq!((first.base_offset, second.base_offset, second.duplicate), (0, 3, false));
    let size = log.size_bytes();
    let retry = log.append(&mut pbatch(1, 0, 0, 3, 1_000), 0).unwrap();
    assert!(retry.duplicate);
    assert_eq!((retry.base_offset, retry.last_offset, retry.record_count), (0, 2, 0));
    assert_eq!((log.size_bytes(), log.log_end_offset()), (size, 5));
    // A gap, an overlapping batch and an older epoch are refused, the log untouched.
    assert!(matches!(
        log.append(&mut pbatch(1, 0, 6, 1, 1_000), 0),
        Err(Error::OutOfOrderSequence { producer_id: 1, expected: 5, found: 6, .. })
    ));
    assert!(matches!(log.append(&mut pbatch(1, 0, 4, 2, 1_000), 0), Err(Error::OutOfOrderSequence { .. })));
    log.append(&mut pbatch(1, 1, 0, 1, 1_000), 0).unwrap();
    assert!(matches!(
        log.append(&mut pbatch(1, 0, 5, 1, 1_000), 0),
        Err(Error::InvalidProducerEpoch { producer_id: 1, epoch: 0, current: 1 })
    ));
    // A newer epoch must start at sequence 0.
    assert!(matches!(log.append(&mut pbatch(1, 2, 1, 1, 1_000), 0), Err(Error::OutOfOrderSequence { expected: 0, .. })));
    assert_eq!(log.log_end_offset(), 6);
    // Plain (non-idempotent) batches are never checked.
    log.append(&mut common::batch(1, 5, 1_000), 0).unwrap();
    log.append(&mut common::batch(1, 5, 1_000), 0).unwrap();
    assert_eq!(log.log_end_offset(), 8);
    assert_eq!(
        log.producers(),
        vec![ProducerInfo {
            producer_id: 1,
            epoch: 1,
            last_sequence: 0,
            last_offset: 5,
            last_timestamp: 1_000,
            coordinator_epoch: -1,
            txn_start_offset: None
        }]
    );
}

#[test]
fn followers_apply_batches_unchecked_and_then_detect_retries_as_leaders() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    // The leader's log: seq 0-1 at offset 0, seq 7 at offset 2 (a gap a leader would refuse:
    // the follower copies whatever the leader wrote).
    for (seq, n, offset) in [(0, 2, 0), (7, 1, 2)] {
        let mut b = pbatch(9, 0, seq, n, 1_000);
        fjord_record::batch::set_base_offset(&mut b, offset);
        log.append_replicated(&b).unwrap();
    }
    // Promoted to leader: a retry of the last batch is a duplicate.
    let retry = log.append(&mut pbatch(9, 0, 7, 1, 1_000), 3).unwrap();
    assert!(retry.duplicate);
    assert_eq!(retry.base_offset, 2);
    assert_eq!(log.append(&mut pbatch(9, 0, 8, 1, 1_000), 3).unwrap().base_offset, 3);
}

#[test]
fn the_state_survives_a_clean_close_and_a_crash() {
    for clean in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), tiny()).unwrap();
        let mut offsets = Vec::new();
        for seq in 0..20 {
            offsets.push(log.append(&mut pbatch(4, 0, seq, 1, 1_000), 0).unwrap().base_offset);
        }
        assert!(!snapshots(&log).is_empty(), "rolling segments writes snapshots");
        let before = log.producers();
        if clean {
            log.close().unwrap();
            assert!(snapshots(&log).contains(&format!("{:020}.snapshot", 20)), "close snapshots at the log end");
        }
        drop(log);
        let log = Log::open(dir.path(), tiny()).unwrap();
        assert_eq!(log.producers(), before, "clean: {clean}");
        for seq in 15..20 {
            let retry = log.append(&mut pbatch(4, 0, seq, 1, 1_000), 0).unwrap();
            assert!(retry.duplicate, "clean: {clean}, seq {seq}");
            assert_eq!(retry.base_offset, offsets[seq as usize]);
        }
        assert!(matches!(log.append(&mut pbatch(4, 0, 14, 1, 1_000), 0), Err(Error::OutOfOrderSequence { .. })));
        assert_eq!(log.append(&mut pbatch(4, 0, 20, 1, 1_000), 0).unwrap().base_offset, 20);
    }
}

#[test]
fn recovery_starts_from_the_latest_snapshot_instead_of_rescanning() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    for seq in 0..30 {
        log.append(&mut pbatch(5, 0, seq, 1, 1_000), 0).unwrap();
    }
    log.close().unwrap();
    drop(log);
    // Replace the snapshot at the log end with one claiming another producer: if the
    // open used it (and did not rescan the log), only that producer is known.
    let path = dir.path().join(format!("{:020}.snapshot", 30));
    std::fs::write(&path, "0\n1\n77 3 1000 0 4 25 29\n").unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    assert_eq!(
        log.producers(),
        vec![ProducerInfo {
            producer_id: 77,
            epoch: 3,
            last_sequence: 4,
            last_offset: 29,
            last_timestamp: 1_000,
            coordinator_epoch: -1,
            txn_start_offset: None
        }]
    );
    drop(log);
    // An unreadable snapshot is dropped and an older one (or the log) used instead.
    std::fs::write(&path, "garbage").unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    assert!(!dir.path().join(format!("{:020}.snapshot", 30)).exists());
    assert_eq!(log.producers()[0].producer_id, 5);
    assert_eq!(log.producers()[0].last_sequence, 29);
}

#[test]
fn truncation_and_retention_keep_the_state_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), tiny()).unwrap();
    for seq in 0..30 {
        log.append(&mut pbatch(6, 0, seq, 1, 1_000), 0).unwrap();
    }
    // A follower truncating to 12: batches 12.. are gone, so seq 12 is new again.
    log.truncate_to(12).unwrap();
    assert_eq!(log.producers()[0].last_sequence, 11);
    assert!(snapshots(&log).iter().all(|s| s[..20].parse::<Offset>().unwrap() <= 12));
    assert!(log.append(&mut pbatch(6, 0, 11, 1, 1_000), 0).unwrap().duplicate);
    let again = log.append(&mut pbatch(6, 0, 12, 1, 1_000), 0).unwrap();
    assert_eq!((again.base_offset, again.duplicate), (12, false));
    // A producer whose batches all fall to retention is forgotten; so are old snapshots.
    log.append(&mut pbatch(8, 0, 0, 1, 1_000), 0).unwrap();
    for seq in 13..40 {
        log.append(&mut pbatch(6, 0, seq, 1, 1_000), 0).unwrap();
    }
    log.update_config(LogConfig { retention_bytes: Some(300), ..tiny() }).unwrap();
    assert!(log.apply_retention(2_000).unwrap() > 0);
    let start = log.log_start_offset();
    assert!(start > 13);
    assert_eq!(log.producers().iter().map(|p| p.producer_id).collect::<Vec<_>>(), vec![6]);
    assert!(snapshots(&log).iter().all(|s| s[..20].parse::<Offset>().unwrap() >= start));
    // Emptied and restarted (a follower behind the leader's log start): no state left.
    log.truncate_fully_and_start_at(100).unwrap();
    assert!(log.producers().is_empty());
    assert!(snapshots(&log).is_empty());
}

#[test]
fn idle_producers_expire() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { producer_id_expiration: Duration::from_secs(60), ..LogConfig::default() };
    let log = Log::open(dir.path(), config).unwrap();
    log.append(&mut pbatch(1, 0, 0, 1, 1_000), 0).unwrap();
    log.append(&mut pbatch(2, 0, 0, 1, 50_000), 0).unwrap();
    log.apply_retention(1_000 + 59_999).unwrap();
    assert_eq!(log.producers().len(), 2);
    log.apply_retention(1_000 + 60_000).unwrap();
    assert_eq!(log.producers().iter().map(|p| p.producer_id).collect::<Vec<_>>(), vec![2]);
    // An expired producer is unknown: its next batch is accepted at any sequence.
    assert!(!log.append(&mut pbatch(1, 0, 0, 1, 1_000), 0).unwrap().duplicate);
}

// ---------------------------------------------------------------------------------
// Model-based test.

#[derive(Debug, Clone)]
enum Op {
    /// The producer's next batch of `n` records.
    Send {
        pid: i64,
        n: usize,
    },
    /// Resend the `back`-th last batch the producer sent (may be long gone from the cache).
    Retry {
        pid: i64,
        back: usize,
    },
    /// A batch that skips `skip` sequence numbers.
    Gap {
        pid: i64,
        skip: i32,
    },
    /// The producer bumps its epoch (its next batch starts at 0).
    Bump {
        pid: i64,
    },
    /// A batch from the previous epoch.
    Zombie {
        pid: i64,
    },
    /// A non-idempotent batch.
    Plain,
    Truncate {
        at: u32,
    },
    Reopen {
        clean: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let pid = 1i64..3;
    prop_oneof![
        6 => (pid.clone(), 1usize..4).prop_map(|(pid, n)| Op::Send { pid, n }),
        4 => (pid.clone(), 0usize..8).prop_map(|(pid, back)| Op::Retry { pid, back }),
        1 => (pid.clone(), 1i32..3).prop_map(|(pid, skip)| Op::Gap { pid, skip }),
        1 => pid.clone().prop_map(|pid| Op::Bump { pid }),
        1 => pid.prop_map(|pid| Op::Zombie { pid }),
        1 => Just(Op::Plain),
        1 => any::<u32>().prop_map(|at| Op::Truncate { at }),
        1 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
    ]
}

/// A batch in the model log: producer, epoch, sequence range, offset range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    pid: i64,
    epoch: i16,
    first_seq: i32,
    last_seq: i32,
    base: Offset,
    last: Offset,
}

#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Append,
    Duplicate(Offset, Offset),
    OutOfOrder,
    Fenced,
}

/// What Kafka's rules say about a batch, from the batches in the log.
fn expect(log: &[Entry], pid: i64, epoch: i16, first: i32, last: i32) -> Expect {
    let mine: Vec<&Entry> = log.iter().filter(|e| e.pid == pid).collect();
    let Some(latest) = mine.last() else {
        return Expect::Append;
    };
    if epoch < latest.epoch {
        return Expect::Fenced;
    }
    if epoch > latest.epoch {
        return if first == 0 { Expect::Append } else { Expect::OutOfOrder };
    }
    let cache: Vec<&&Entry> = mine.iter().rev().take_while(|e| e.epoch == epoch).take(5).collect();
    if let Some(d) = cache.iter().find(|e| e.first_seq == first && e.last_seq == last) {
        return Expect::Duplicate(d.base, d.last);
    }
    if first == latest.last_seq + 1 {
        Expect::Append
    } else {
        Expect::OutOfOrder
    }
}

/// The log's batches as model entries (plain batches have pid -1).
fn entries_of(log: &Log) -> Vec<Entry> {
    read_all(log)
        .into_iter()
        .map(|(_, bytes)| {
            let h = BatchHeader::parse(&bytes).unwrap();
            Entry {
                pid: h.producer_id,
                epoch: h.producer_epoch,
                first_seq: h.base_sequence,
                last_seq: h.base_sequence + h.last_offset_delta,
                base: h.base_offset,
                last: h.last_offset(),
            }
        })
        .collect()
}

/// A producer's current epoch and the batches it sent: (epoch, first sequence, records).
type Sent = (i16, Vec<(i16, i32, usize)>);

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_log_follows_kafkas_idempotence_rules(ops in prop::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), tiny()).unwrap();
        let mut model: Vec<Entry> = Vec::new();
        // What each producer has sent, in order (epoch, first, n), and its current epoch.
        let mut sent: std::collections::HashMap<i64, Sent> = Default::default();
        for op in ops {
            let attempt = match op {
                Op::Send { pid, n } => {
                    let (epoch, history) = sent.entry(pid).or_default();
                    let next = model
                        .iter()
                        .rev()
                        .find(|e| e.pid == pid && e.epoch == *epoch)
                        .map_or(0, |e| e.last_seq + 1);
                    history.push((*epoch, next, n));
                    Some((pid, *epoch, next, n))
                }
                Op::Retry { pid, back } => sent.get(&pid).and_then(|(_, h)| h.iter().rev().nth(back)).map(|&(e, s, n)| (pid, e, s, n)),
                Op::Gap { pid, skip } => {
                    let epoch = sent.get(&pid).map_or(0, |s| s.0);
                    model.iter().rev().find(|e| e.pid == pid && e.epoch == epoch).map(|e| (pid, epoch, e.last_seq + 1 + skip, 1))
                }
                Op::Bump { pid } => {
                    sent.entry(pid).or_default().0 += 1;
                    None
                }
                Op::Zombie { pid } => {
                    let epoch = sent.get(&pid).map_or(0, |s| s.0);
                    (epoch > 0).then_some((pid, epoch - 1, 0, 1))
                }
                Op::Plain => {
                    let info = log.append(&mut common::batch(1, 3, 1_000), 0).unwrap();
                    model.push(Entry { pid: -1, epoch: -1, first_seq: -1, last_seq: -1, base: info.base_offset, last: info.last_offset });
                    None
                }
                Op::Truncate { at } => {
                    let end = log.log_end_offset();
                    let at = Offset::from(at) % (end + 1);
                    log.truncate_to(at).unwrap();
                    model.retain(|e| e.last < at);
                    None
                }
                Op::Reopen { clean } => {
                    if clean {
                        log.close().unwrap();
                    }
                    drop(log);
                    log = Log::open(dir.path(), tiny()).unwrap();
                    None
                }
            };
            if let Some((pid, epoch, first, n)) = attempt {
                let last = first + n as i32 - 1;
                let expected = expect(&model, pid, epoch, first, last);
                let end = log.log_end_offset();
                let got = log.append(&mut pbatch(pid, epoch, first, n, 1_000), 0);
                match (&expected, got) {
                    (Expect::Append, Ok(info)) => {
                        prop_assert!(!info.duplicate);
                        prop_assert_eq!(info.base_offset, end);
                        model.push(Entry { pid, epoch, first_seq: first, last_seq: last, base: info.base_offset, last: info.last_offset });
                    }
                    (Expect::Duplicate(base, last_offset), Ok(info)) => {
                        prop_assert!(info.duplicate);
                        prop_assert_eq!((info.base_offset, info.last_offset), (*base, *last_offset));
                    }
                    (Expect::OutOfOrder, Err(Error::OutOfOrderSequence { .. })) => {}
                    (Expect::Fenced, Err(Error::InvalidProducerEpoch { .. })) => {}
                    (expected, got) => prop_assert!(false, "expected {:?}, got {:?}", expected, got),
                }
            }
            prop_assert_eq!(entries_of(&log), model.clone());
        }
    }
}
