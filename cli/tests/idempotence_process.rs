//! An independent idempotent producer across a broker crash: Python confluent-kafka
//! (librdkafka) with `enable.idempotence=True` produces 100,000 records while `fjord
//! broker` is killed with SIGKILL mid-stream and started again on the same port and data
//! dir. Requests the broker appended but never answered are retried by librdkafka after
//! the restart; the producer state the broker recovers from its log and snapshots must
//! recognise them, so every record is stored exactly once, in order. Single broker: the
//! three-broker failover variant needs cluster mode.
//!
//! The interpreter is `$FJORD_TEST_PYTHON` (set by `cargo xtask test`), else the
//! workspace's `target/venv/bin/python`.

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Produces 100,000 records with `enable.idempotence=True`, says `restart` once a quarter
/// is delivered (while half is still to come), then checks every record was delivered
/// and is stored exactly once, in order.
const IDEMPOTENT_SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Producer, Consumer, TopicPartition as CTP

bootstrap, n = sys.argv[1], 100000
errors, delivered = [], [0]
def on_delivery(err, msg):
    if err is not None:
        errors.append(str(err))
    else:
        delivered[0] += 1
p = Producer({'bootstrap.servers': bootstrap, 'enable.idempotence': True, 'linger.ms': 5,
              'message.timeout.ms': 120000, 'reconnect.backoff.max.ms': 200, 'retry.backoff.ms': 50})
for i in range(n):
    while True:
        try:
            p.produce('idempotent', value=b'm%d' % i, on_delivery=on_delivery)
            break
        except BufferError:
            p.poll(0.05)
    p.poll(0)
    if i == n // 2:
        while delivered[0] < n // 4:
            p.poll(0.05)
        print('restart', flush=True)
assert p.flush(120) == 0, 'confluent-kafka left messages undelivered'
assert not errors, errors[:5]
assert delivered[0] == n, delivered[0]

c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'unused', 'enable.auto.commit': False})
c.assign([CTP('idempotent', 0, 0)])
values = []
deadline = time.time() + 60
while len(values) < n and time.time() < deadline:
    for m in c.consume(10000, 0.5):
        if not m.error():
            values.append(m.value())
low, high = c.get_watermark_offsets(CTP('idempotent', 0), timeout=10)
c.close()
assert (low, high) == (0, n), ('stored', low, high, 'for', n, 'sent')
assert values == [b'm%d' % i for i in range(n)], 'records missing, duplicated or out of order'
print('ok', flush=True)
"#;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("FJORD_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/venv/bin/python")
}

fn start_broker(addr: SocketAddr, data_dir: &Path) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["broker", "--id", "0", "--listen", &addr.to_string(), "--data-dir"])
        .arg(data_dir)
        .env("RUST_LOG", "warn")
        // An fsync after every append widens the window between appending a batch and
        // answering for it, where SIGKILL leaves an appended batch unacknowledged.
        .env("FJORD_LOG_FLUSH_INTERVAL_MESSAGES", "1")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("fjord exited early: {status}");
        }
        assert!(Instant::now() < deadline, "fjord did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

#[test]
fn confluent_kafka_idempotent_producer_survives_kill_9_exactly_once() {
    let python = python();
    assert!(python.exists(), "Python venv with confluent-kafka not found at {} (set FJORD_TEST_PYTHON)", python.display());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut broker = start_broker(addr, &data);
    let mut script = Command::new(&python)
        .arg("-c")
        .arg(IDEMPOTENT_SCRIPT)
        .arg(addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = script.stderr.take().unwrap();
    // Drained on a thread so a chatty librdkafka cannot block the script on a full pipe.
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut lines = Vec::new();
    for line in BufReader::new(script.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line == "restart" {
            broker.kill().unwrap(); // SIGKILL: no clean shutdown, in-flight requests unanswered
            broker.wait().unwrap();
            broker = start_broker(addr, &data);
        }
        lines.push(line);
    }
    let status = script.wait().unwrap();
    let stderr = stderr.join().unwrap();
    broker.kill().unwrap();
    broker.wait().unwrap();
    assert!(
        status.success() && lines.iter().any(|l| l == "restart") && lines.last().is_some_and(|l| l == "ok"),
        "idempotent confluent-kafka run failed ({status}):\n{}\n{stderr}",
        lines.join("\n")
    );
}
