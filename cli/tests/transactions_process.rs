//! Transactions end to end with an independent client, across a kill -9 (#20):
//! confluent-kafka's transactional producer commits and aborts transactions mixed over
//! two partitions and leaves one open; `fjord broker` is killed with SIGKILL and started
//! again on its data dir. The partitions must come back with their aborted-transactions
//! index and open transaction (rebuilt from the log, which had no clean shutdown), the
//! coordinator must abort the orphaned transaction at its timeout, and then a
//! read_committed consumer must see exactly the committed records in order (having
//! waited at the last stable offset), a read_uncommitted one every record.
//!
//! The interpreter is `$FJORD_TEST_PYTHON` (set by `cargo xtask test`), else the
//! workspace's `target/venv/bin/python`.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};

/// Phase 1: six transactions of five records per partition, even ones committed, odd
/// ones aborted (flushed first, so their records are in the log), then a seventh left
/// open: says `open` and waits to be killed.
const PRODUCE_SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap = sys.argv[1]
admin = AdminClient({'bootstrap.servers': bootstrap})
for f in admin.create_topics([NewTopic('mixed', num_partitions=2, replication_factor=1)]).values():
    f.result()
p = Producer({'bootstrap.servers': bootstrap, 'transactional.id': 'mixed-tx', 'transaction.timeout.ms': 5000})
p.init_transactions(30)
for t in range(7):
    p.begin_transaction()
    for i in range(5):
        for part in (0, 1):
            p.produce('mixed', value=b't%d-r%d-p%d' % (t, i, part), partition=part)
    # Abort purges what is still queued: flush so the aborted records reach the log.
    assert p.flush(30) == 0
    if t == 6:
        print('open', flush=True)
        time.sleep(600)
    elif t % 2 == 0:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)
"#;

/// Phase 2, after the restart: read_committed waits until its position reaches the high
/// watermark (the open transaction aborted at its timeout), then both consumers check
/// what they got.
const CONSUME_SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Consumer, TopicPartition as TP

bootstrap = sys.argv[1]
every = {part: [b't%d-r%d-p%d' % (t, i, part) for t in range(7) for i in range(5)] for part in (0, 1)}
committed = {part: [b't%d-r%d-p%d' % (t, i, part) for t in range(0, 6, 2) for i in range(5)] for part in (0, 1)}

# The high watermark (a read_committed consumer's watermarks are its LSO instead).
probe = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'probe', 'isolation.level': 'read_uncommitted'})

def read(isolation, want):
    c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'check-' + isolation, 'isolation.level': isolation,
                  'enable.auto.commit': False})
    c.assign([TP('mixed', 0, 0), TP('mixed', 1, 0)])
    got = {0: [], 1: []}
    passed = False
    deadline = time.time() + 90
    while not passed and time.time() < deadline:
        for m in c.consume(1000, 0.5):
            if not m.error():
                got[m.partition()].append(m.value())
        positions = c.position([TP('mixed', 0), TP('mixed', 1)])
        highs = [probe.get_watermark_offsets(TP('mixed', part), timeout=10)[1] for part in (0, 1)]
        # Past the last marker: every transaction decided and read.
        passed = all(p.offset >= h > 0 for p, h in zip(positions, highs))
    c.close()
    assert passed, (isolation, 'never got past the last stable offset', positions, highs)
    assert got == want, (isolation, {k: len(v) for k, v in got.items()}, got)

read('read_uncommitted', every)
read('read_committed', committed)
probe.close()
print('ok', flush=True)
"#;

fn start_broker(addr: SocketAddr, data_dir: &Path) -> common::FjordProcess {
    common::start_broker(
        addr.port(),
        data_dir,
        // The coordinator looks for timed-out transactions every second.
        &[("FJORD_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS", "1000")],
    )
}

/// Runs `script` with the broker's address; returns (success, stdout lines, stderr) and
/// calls `on_line` with each line as it comes.
fn run(python: &Path, script: &str, addr: SocketAddr, mut on_line: impl FnMut(&str)) -> (bool, Vec<String>, String) {
    let mut child = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    // Drained on a thread so a chatty librdkafka cannot block the script on a full pipe.
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut lines = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        on_line(&line);
        lines.push(line.clone());
        if line == "open" {
            // The producer dies with the broker: nobody will end its transaction.
            let _ = child.kill();
            break;
        }
    }
    let status = child.wait().unwrap();
    (status.success(), lines, stderr.join().unwrap())
}

#[test]
fn confluent_kafka_transactions_mixed_over_two_partitions_survive_kill_9() {
    let python = fjord_testkit::python().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut broker = start_broker(addr, &data);
    let (_, lines, stderr) = run(&python, PRODUCE_SCRIPT, addr, |line| {
        if line == "open" {
            broker.kill().unwrap(); // SIGKILL: no flush, no snapshot, no clean shutdown marker
            broker.wait().unwrap();
        }
    });
    assert_eq!(lines, vec!["open"], "the producer failed:\n{stderr}");
    let mut broker = start_broker(addr, &data);
    let (ok, lines, stderr) = run(&python, CONSUME_SCRIPT, addr, |_| {});
    broker.kill().unwrap();
    broker.wait().unwrap();
    assert!(ok && lines == ["ok"], "the consumers failed:\n{}\n{stderr}", lines.join("\n"));
    // What recovery rebuilt is on disk: each partition's aborted transactions, in a
    // .txnindex of Kafka's 34-byte entries (three aborted, and the timed-out one).
    for part in 0..2 {
        let entries: u64 = std::fs::read_dir(data.join(format!("mixed-{part}")))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "txnindex"))
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum::<u64>()
            / 34;
        assert_eq!(entries, 4, "partition {part}");
    }
}
