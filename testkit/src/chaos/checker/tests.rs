use super::*;
use crate::chaos::history::{Commit, CommitOffset, FinalRead, Poll, Produce, Rebalance, Record, TxnWrite};

fn write(process: u32, at: u64, partition: i32, value: &str, acks: Acks, outcome: Outcome, offset: Option<i64>) -> Event {
    Event::Produce(Produce {
        process,
        invoke_us: at,
        complete_us: at + 5,
        partition,
        value: value.into(),
        acks,
        idempotent: acks == Acks::All,
        outcome,
        offset,
        error: None,
    })
}

fn ok_all(at: u64, partition: i32, value: &str, offset: i64) -> Event {
    write(1, at, partition, value, Acks::All, Outcome::Ok, Some(offset))
}

fn stored(partition: i32, values: &[&str]) -> Event {
    Event::FinalRead(FinalRead {
        partition,
        time_us: 1_000_000,
        start_offset: 0,
        end_offset: values.len() as i64,
        records: values.iter().enumerate().map(|(o, v)| rec(partition, o as i64, v)).collect(),
    })
}

fn rec(partition: i32, offset: i64, value: &str) -> Record {
    Record { partition, offset, value: value.into() }
}

fn poll(consumer: &str, generation: i32, at: u64, records: &[(i32, i64, &str)]) -> Event {
    Event::Poll(Poll {
        process: 9,
        consumer: consumer.into(),
        generation,
        invoke_us: at,
        complete_us: at + 5,
        outcome: Outcome::Ok,
        records: records.iter().map(|&(p, o, v)| rec(p, o, v)).collect(),
        error: None,
    })
}

fn commit(consumer: &str, generation: i32, at: u64, partition: i32, offset: i64) -> Event {
    Event::Commit(Commit {
        process: 9,
        group: "g".into(),
        consumer: consumer.into(),
        generation,
        invoke_us: at,
        complete_us: at + 5,
        offsets: vec![CommitOffset { partition, offset }],
        outcome: Outcome::Ok,
        error: None,
    })
}

fn rebalance(consumer: &str, generation: i32, at: u64) -> Event {
    Event::Rebalance(Rebalance {
        process: 9,
        consumer: consumer.into(),
        member_id: format!("{consumer}-m{generation}"),
        generation,
        time_us: at,
        assigned: vec![0],
    })
}

/// A clean history: writes acknowledged in order, consumers reading every one once,
/// commits moving forward, a rebalance that legitimately re-reads.
fn clean() -> Vec<Event> {
    vec![
        ok_all(10, 0, "a", 0),
        ok_all(20, 0, "b", 1),
        write(2, 25, 0, "x", Acks::All, Outcome::Unknown, None),
        ok_all(30, 0, "c", 2),
        write(3, 40, 1, "one", Acks::One, Outcome::Ok, Some(0)),
        write(3, 50, 1, "lost-before-ack", Acks::One, Outcome::Fail, None),
        poll("c1", 1, 60, &[(0, 0, "a"), (0, 1, "b")]),
        commit("c1", 1, 70, 0, 2),
        poll("c1", 1, 80, &[(0, 2, "c")]),
        rebalance("c1", 2, 90),
        poll("c1", 2, 100, &[(0, 2, "c"), (0, 3, "x")]),
        commit("c1", 2, 110, 0, 4),
        stored(0, &["a", "b", "c", "x"]),
        stored(1, &["one"]),
    ]
}

#[test]
fn a_clean_history_has_no_anomaly() {
    let report = check(&clean()).unwrap();
    assert_eq!(report.anomalies, vec![], "{report:#?}");
    assert_eq!(report.operations, 11);
    assert_eq!((report.acked_all, report.acked_one, report.indeterminate), (3, 1, 1));
    assert_eq!(report.records_read, 5);
    assert_eq!(report.violations(), 0);
}

fn only(events: Vec<Event>, kind: AnomalyKind) -> Report {
    let report = check(&events).unwrap();
    assert!(report.count(kind) > 0, "expected {kind}: {report:#?}");
    for a in &report.anomalies {
        assert_eq!(a.kind, kind, "only {kind} expected: {report:#?}");
    }
    report
}

#[test]
fn an_acknowledged_write_missing_from_the_log_is_lost() {
    let mut h = clean();
    h.push(ok_all(35, 1, "gone", 1));
    let report = only(h, AnomalyKind::LostWrite);
    assert_eq!(report.violations(), 1);
    assert!(report.anomalies[0].detail.contains("\"gone\""), "{report:#?}");
}

#[test]
fn an_acks1_loss_is_counted_but_is_no_violation() {
    let mut h = clean();
    h.push(write(3, 55, 1, "one-lost", Acks::One, Outcome::Ok, Some(1)));
    let report = only(h, AnomalyKind::Acks1Lost);
    assert_eq!(report.violations(), 0);
    assert_eq!(report.count(AnomalyKind::Acks1Lost), 1);
}

#[test]
fn an_idempotent_value_stored_twice_is_a_duplicate() {
    let mut h = clean();
    h.pop();
    h.pop();
    // "x" was sent once with an unknown outcome; a retry stored it twice.
    h.push(stored(0, &["a", "b", "c", "x", "x"]));
    h.push(stored(1, &["one"]));
    let report = only(h, AnomalyKind::Duplicate);
    assert_eq!(report.count(AnomalyKind::Duplicate), 1);
    // A non-idempotent (acks=1) value twice is what retries without idempotence do.
    let mut h = clean();
    h.pop();
    h.push(stored(1, &["one", "one"]));
    assert_eq!(check(&h).unwrap().anomalies, vec![]);
}

#[test]
fn one_offset_with_two_values_is_a_conflict() {
    // Two acknowledgements of the same offset, and the log keeps one of them.
    let h = vec![ok_all(10, 0, "a", 0), ok_all(20, 0, "b", 0), stored(0, &["a", "b"])];
    let report = check(&h).unwrap();
    assert_eq!(report.count(AnomalyKind::OffsetConflict), 1, "{report:#?}");
    // "b" is stored at 1, not where it was acknowledged: also an order anomaly.
    assert!(report.count(AnomalyKind::Order) >= 1, "{report:#?}");
    assert!(report.anomalies.iter().all(|a| a.kind.is_violation()));
}

#[test]
fn a_value_stored_away_from_its_acknowledged_offset_is_out_of_order() {
    // Acknowledged at 1 and 0, in that real-time order; stored the other way round.
    let h = vec![ok_all(10, 0, "a", 1), ok_all(20, 0, "b", 0), stored(0, &["b", "a"])];
    let report = only(h, AnomalyKind::Order);
    assert_eq!(report.count(AnomalyKind::Order), 1, "{report:#?}");
    assert!(report.anomalies[0].detail.contains("below"), "{report:#?}");
    // Acknowledged at 0, stored at 1 behind an unacknowledged value.
    let h = vec![ok_all(10, 0, "a", 0), write(2, 5, 0, "u", Acks::All, Outcome::Unknown, None), stored(0, &["u", "a"])];
    let report = check(&h).unwrap();
    assert!(report.count(AnomalyKind::Order) == 1, "{report:#?}");
    // Concurrent writes may take either order.
    let h = vec![
        write(1, 10, 0, "a", Acks::All, Outcome::Ok, Some(1)),
        write(2, 12, 0, "b", Acks::All, Outcome::Ok, Some(0)),
        stored(0, &["b", "a"]),
    ];
    assert_eq!(check(&h).unwrap().anomalies, vec![]);
}

#[test]
fn a_read_the_log_no_longer_holds_vanished() {
    let mut h = clean();
    h.push(poll("c2", 1, 95, &[(0, 4, "ghost")]));
    let report = check(&h).unwrap();
    assert_eq!(report.count(AnomalyKind::ReadVanished), 1, "{report:#?}");
    // Past the log's end there is no value to conflict with: only the vanished read.
    assert_eq!(report.anomalies.len(), 1, "{report:#?}");
    // A read of another value at a stored offset is also a conflict.
    let mut h = clean();
    h.push(poll("c2", 1, 95, &[(0, 1, "other")]));
    let report = check(&h).unwrap();
    assert_eq!(report.count(AnomalyKind::ReadVanished), 1, "{report:#?}");
    assert_eq!(report.count(AnomalyKind::OffsetConflict), 1, "{report:#?}");
}

#[test]
fn a_consumer_skipping_offsets_without_a_rebalance_is_flagged() {
    let h = vec![
        ok_all(10, 0, "a", 0),
        ok_all(20, 0, "b", 1),
        ok_all(30, 0, "c", 2),
        poll("c1", 1, 40, &[(0, 0, "a")]),
        poll("c1", 1, 50, &[(0, 2, "c")]),
        stored(0, &["a", "b", "c"]),
    ];
    let report = only(h, AnomalyKind::ConsumerSkip);
    assert_eq!(report.count(AnomalyKind::ConsumerSkip), 1);
}

#[test]
fn a_consumer_going_back_needs_a_rebalance() {
    let base = vec![ok_all(10, 0, "a", 0), ok_all(20, 0, "b", 1), stored(0, &["a", "b"])];
    let mut h = base.clone();
    h.push(poll("c1", 1, 40, &[(0, 0, "a"), (0, 1, "b")]));
    h.push(poll("c1", 1, 50, &[(0, 1, "b")]));
    only(h, AnomalyKind::ConsumerBack);
    // After a rebalance, starting over from the committed offset is fine.
    let mut h = base.clone();
    h.push(poll("c1", 1, 40, &[(0, 0, "a"), (0, 1, "b")]));
    h.push(rebalance("c1", 2, 45));
    h.push(poll("c1", 2, 50, &[(0, 1, "b")]));
    assert_eq!(check(&h).unwrap().anomalies, vec![]);
    // A rebalance keeping the generation number (a new coordinator counts from 1
    // again; the member id is new) resets the consumer's positions too.
    let mut h = base.clone();
    h.push(poll("c1", 2, 40, &[(0, 0, "a"), (0, 1, "b")]));
    h.push(rebalance("c1", 2, 45));
    h.push(poll("c1", 2, 50, &[(0, 0, "a")]));
    assert_eq!(check(&h).unwrap().anomalies, vec![]);
    // A poll in a new generation counts as one even if the rebalance was not logged.
    let mut h = base;
    h.push(poll("c1", 1, 40, &[(0, 0, "a"), (0, 1, "b")]));
    h.push(poll("c1", 3, 50, &[(0, 0, "a")]));
    assert_eq!(check(&h).unwrap().anomalies, vec![]);
}

#[test]
fn a_committed_offset_going_backwards_is_flagged() {
    let mut h = clean();
    h.push(commit("c2", 3, 200, 0, 1));
    let report = only(h, AnomalyKind::CommitBackwards);
    assert_eq!(report.count(AnomalyKind::CommitBackwards), 1);
    // Two concurrent commits may complete in either order.
    let h = vec![commit("c1", 1, 10, 0, 5), commit("c2", 1, 12, 0, 3), stored(0, &[])];
    assert_eq!(check(&h).unwrap().anomalies, vec![]);
    // A failed commit does not count.
    let mut h = clean();
    let Event::Commit(mut failed) = commit("c2", 3, 200, 0, 1) else { unreachable!() };
    failed.outcome = Outcome::Fail;
    h.push(Event::Commit(failed));
    assert_eq!(check(&h).unwrap().anomalies, vec![]);
}

#[test]
fn a_history_without_the_final_read_of_a_written_partition_cannot_be_judged() {
    let h = vec![ok_all(10, 2, "a", 0), stored(0, &[])];
    let error = check(&h).unwrap_err().to_string();
    assert!(error.contains("partition 2"), "{error}");
}

#[test]
fn a_history_round_trips_through_json_lines() {
    let events = clean();
    let mut text = Vec::new();
    for e in &events {
        crate::chaos::history::write_event(&mut text, e).unwrap();
    }
    let back = crate::chaos::history::read_history(&text[..]).unwrap();
    assert_eq!(back, events);
    let error = crate::chaos::history::read_history(&b"{\"op\":\"produce\"}\n"[..]).unwrap_err();
    assert!(format!("{error:#}").contains("line 1"), "{error:#}");
}

fn txn(id: &str, at: u64, writes: &[(i32, &str)], decision: Decision, outcome: Outcome) -> Event {
    Event::Transaction(crate::chaos::history::Transaction {
        process: 7,
        transactional_id: id.into(),
        invoke_us: at,
        complete_us: at + 5,
        writes: writes.iter().map(|&(partition, v)| TxnWrite { partition, value: v.into() }).collect(),
        decision,
        outcome,
        error: None,
    })
}

fn committed_stored(partition: i32, records: &[(i64, &str)]) -> Event {
    Event::CommittedFinalRead(FinalRead {
        partition,
        time_us: 1_000_000,
        start_offset: 0,
        end_offset: records.last().map_or(0, |r| r.0 + 2),
        records: records.iter().map(|&(o, v)| rec(partition, o, v)).collect(),
    })
}

fn committed_poll(consumer: &str, incarnation: i32, at: u64, records: &[(i32, i64, &str)]) -> Event {
    match poll(consumer, incarnation, at, records) {
        Event::Poll(p) => Event::CommittedPoll(p),
        _ => unreachable!(),
    }
}

/// A clean transactional history: a committed transaction over two partitions, an
/// aborted one (its records and markers take offsets read_committed skips), one whose
/// end is unknown and that committed, and a reader that saw the committed values.
fn clean_txn() -> Vec<Event> {
    let mut h = clean();
    h.extend([
        txn("t1", 10, &[(0, "t1-a"), (1, "t1-b")], Decision::Commit, Outcome::Ok),
        txn("t1", 20, &[(0, "t1-c")], Decision::Abort, Outcome::Ok),
        txn("t2", 30, &[(0, "t2-a"), (1, "t2-b")], Decision::Commit, Outcome::Unknown),
        txn("t2", 40, &[(1, "t2-c")], Decision::Abort, Outcome::Unknown),
        committed_poll("rc0", 0, 50, &[(0, 0, "t1-a"), (0, 4, "t2-a")]),
        committed_poll("rc0", 0, 60, &[(1, 0, "t1-b")]),
        committed_stored(0, &[(0, "t1-a"), (4, "t2-a")]),
        committed_stored(1, &[(0, "t1-b"), (2, "t2-b")]),
    ]);
    h
}

#[test]
fn a_clean_transactional_history_has_no_anomaly() {
    let report = check(&clean_txn()).unwrap();
    assert_eq!(report.anomalies, vec![], "{report:#?}");
    assert_eq!((report.committed, report.aborted), (1, 1));
    assert_eq!(report.operations, 11 + 6);
    assert_eq!(report.records_read, 5 + 3);
}

#[test]
fn a_committed_transactions_value_missing_from_read_committed_is_lost() {
    let mut h = clean_txn();
    h.push(txn("t3", 70, &[(1, "t3-a")], Decision::Commit, Outcome::Ok));
    let report = only(h, AnomalyKind::TxnLost);
    assert!(report.anomalies[0].detail.contains("t3-a"), "{report:#?}");
}

#[test]
fn a_value_of_an_acknowledged_abort_read_by_read_committed_is_an_aborted_read() {
    let mut h = clean_txn();
    h.push(committed_poll("rc1", 0, 70, &[(0, 2, "t1-c")]));
    let report = check(&h).unwrap();
    assert_eq!(report.count(AnomalyKind::TxnAbortedRead), 1, "{report:#?}");
    // The final log does not hold it either: the read also vanished.
    assert_eq!(report.count(AnomalyKind::ReadVanished), 1, "{report:#?}");
    assert_eq!(report.anomalies.len(), 2, "{report:#?}");

    let mut h = clean_txn();
    h.retain(|e| !matches!(e, Event::CommittedFinalRead(r) if r.partition == 0));
    h.push(committed_stored(0, &[(0, "t1-a"), (2, "t1-c"), (4, "t2-a")]));
    let report = check(&h).unwrap();
    let aborted: Vec<_> = report.anomalies.iter().filter(|a| a.kind == AnomalyKind::TxnAbortedRead).collect();
    assert_eq!(aborted.len(), 1, "{report:#?}");
    assert!(aborted[0].detail.contains("final read_committed read"), "{report:#?}");
    // rc0 went from offset 0 to 4 past what the final read holds at 2: also a skip.
    assert_eq!(report.count(AnomalyKind::ConsumerSkip), 1, "{report:#?}");
}

#[test]
fn a_transaction_seen_in_part_is_partial_whatever_its_outcome() {
    let mut h = clean_txn();
    h.retain(|e| !matches!(e, Event::CommittedFinalRead(r) if r.partition == 1));
    h.push(committed_stored(1, &[(0, "t1-b")]));
    let report = only(h, AnomalyKind::TxnPartial);
    assert!(report.anomalies[0].detail.contains("t2"), "the unknown-outcome transaction: {report:#?}");
}

#[test]
fn transactional_duplicates_skips_and_steps_back_are_found() {
    let mut h = clean_txn();
    h.retain(|e| !matches!(e, Event::CommittedFinalRead(r) if r.partition == 1));
    h.push(committed_stored(1, &[(0, "t1-b"), (2, "t2-b"), (3, "t2-b")]));
    only(h, AnomalyKind::Duplicate);

    let mut h = clean_txn();
    h.push(committed_poll("rc1", 0, 70, &[(0, 4, "t2-a")]));
    h.push(committed_poll("rc2", 0, 70, &[(1, 2, "t2-b"), (1, 0, "t1-b")]));
    only(h, AnomalyKind::ConsumerBack);

    let mut h = clean_txn();
    h.push(committed_poll("rc1", 0, 70, &[(0, 0, "t1-a")]));
    h.push(committed_poll("rc1", 1, 80, &[(0, 0, "t1-a")]));
    assert_eq!(check(&h).unwrap().anomalies, vec![], "a new incarnation may start over");

    let mut h = clean_txn();
    h.retain(|e| !matches!(e, Event::CommittedFinalRead(r) if r.partition == 0));
    h.push(committed_stored(0, &[(0, "t1-a"), (1, "t9"), (4, "t2-a")]));
    h.push(txn("t9", 45, &[(0, "t9")], Decision::Commit, Outcome::Ok));
    only(h, AnomalyKind::ConsumerSkip);
}

#[test]
fn a_transaction_on_a_partition_without_a_final_read_cannot_be_judged() {
    let mut h = clean_txn();
    h.push(txn("t3", 70, &[(2, "t3-a")], Decision::Commit, Outcome::Ok));
    assert!(check(&h).is_err());
}
