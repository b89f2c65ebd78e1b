//! `fjord broker` and `fjord dev` as real processes: kill -9 and SIGTERM restarts,
//! checked with kcat (an independent client).

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, metrics, start_broker, wait_until_listening};

fn kcat(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat must be installed (cargo xtask test installs it)");
    let mut pipe = child.stdin.take().unwrap();
    if let Some(input) = stdin {
        pipe.write_all(input.as_bytes()).unwrap();
    }
    drop(pipe);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "kcat {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// `offset:value` lines of partition 0, from the beginning to the end.
fn consume_all(bootstrap: &str, topic: &str) -> String {
    kcat(&["-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q", "-f", "%o:%s\n"], None)
}

fn produce(bootstrap: &str, topic: &str, values: std::ops::Range<usize>) {
    let input: String = values.map(|i| format!("v{i}\n")).collect();
    // acks=all: kcat exits only once every message is acknowledged.
    kcat(&["-b", bootstrap, "-P", "-t", topic, "-p", "0", "-X", "acks=all"], Some(&input));
}

fn expected(values: std::ops::Range<usize>) -> String {
    values.map(|i| format!("{i}:v{i}\n")).collect()
}

fn sigterm(child: &Child) {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

#[test]
fn acknowledged_messages_survive_kill_9_and_sigterm_and_offsets_continue() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");

    let mut broker = start_broker(port, &data, &[]);
    produce(&bootstrap, "crash", 0..3000);
    broker.kill().unwrap(); // SIGKILL: no flush, no checkpoint
    broker.wait().unwrap();

    let mut broker = start_broker(port, &data, &[]);
    assert_eq!(consume_all(&bootstrap, "crash"), expected(0..3000), "everything acknowledged survives kill -9");
    produce(&bootstrap, "crash", 3000..3100);
    assert_eq!(consume_all(&bootstrap, "crash"), expected(0..3100), "new offsets continue where they stopped");

    sigterm(&broker);
    let status = broker.wait().unwrap();
    assert!(status.success(), "SIGTERM is a clean shutdown: {status}");
    let recovery_points = std::fs::read_to_string(data.join("recovery-point-offset-checkpoint")).unwrap();
    assert!(recovery_points.contains("crash 0 3100"), "clean shutdown checkpoints: {recovery_points}");

    let mut broker = start_broker(port, &data, &[]);
    assert_eq!(consume_all(&bootstrap, "crash"), expected(0..3100));
    broker.kill().unwrap();
    broker.wait().unwrap();
}

#[test]
fn dev_runs_broker_registry_and_gateway_and_takes_env_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (registry, http, grpc, metrics) = (free_port(), free_port(), free_port(), free_port());
    let mut dev = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["dev", "--data-dir"])
        .arg(dir.path().join("fjord-data"))
        .args(["--registry", &format!("127.0.0.1:{registry}"), "--http", &format!("127.0.0.1:{http}")])
        .args(["--metrics", &format!("127.0.0.1:{metrics}")])
        // FJORD_* variables override the defaults (dev's fixed ports, here).
        .env("FJORD_LISTENERS", format!("127.0.0.1:{port}"))
        .env("FJORD_DEV_GRPC", format!("127.0.0.1:{grpc}"))
        // The broker tier of the audit is on in dev; published every 200 ms here.
        .env("FJORD_AUDIT_INTERVAL_MS", "200")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until_listening(SocketAddr::from(([127, 0, 0, 1], port)), &mut dev);
    for service in [registry, http, grpc, metrics] {
        wait_until_listening(SocketAddr::from(([127, 0, 0, 1], service)), &mut dev);
    }
    let bootstrap = format!("127.0.0.1:{port}");
    produce(&bootstrap, "dev", 0..10);
    assert_eq!(consume_all(&bootstrap, "dev"), expected(0..10));
    // The registry and the gateway answer too, over plain HTTP/1.1.
    let get = |port: u16, path: &str| {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    let subjects = get(registry, "/subjects");
    assert!(subjects.starts_with("HTTP/1.1 200") && subjects.ends_with("[]"), "{subjects}");
    let health = get(http, "/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let topic = get(http, "/topics/dev");
    assert!(topic.starts_with("HTTP/1.1 200") && topic.contains("\"dev\""), "{topic}");
    // An event through the gateway, so its audit counter has something to flush at shutdown.
    let posted = {
        use std::io::{Read, Write};
        let body = "{\"value\":\"via gateway\"}\n";
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", http)).unwrap();
        write!(
            stream,
            "POST /v1/events/dev-gateway HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    assert!(posted.starts_with("HTTP/1.1 200"), "{posted}");
    let scraped = get(metrics, "/metrics");
    assert!(scraped.starts_with("HTTP/1.1 200"), "{scraped}");
    assert!(scraped.contains("fjord_broker_log_end_offset{topic=\"dev\",partition=\"0\"} 10\n"), "{scraped}");
    // The broker counted both topics' appends and published them to `_audit`.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(env!("CARGO_BIN_EXE_fjord"))
            .args(["audit", "report", "--bootstrap", &bootstrap, "--format", "json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let broker = |topic: &str| -> u64 {
            let windows = report["windows"].as_array().unwrap().iter().filter(|w| w["topic"] == topic);
            windows.map(|w| w["counts"]["broker"].as_u64().unwrap_or(0)).sum()
        };
        if (broker("dev"), broker("dev-gateway")) == (10, 1) {
            break;
        }
        assert!(Instant::now() < deadline, "the broker tier never showed 10 + 1 appends: {report}");
        std::thread::sleep(Duration::from_millis(100));
    }
    sigterm(&dev);
    let output = dev.wait_with_output().unwrap();
    assert!(output.status.success(), "SIGTERM stops every service cleanly: {output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains(&format!("Kafka broker     127.0.0.1:{port}")), "{stdout}");
    assert!(stdout.contains(&format!("schema registry  http://127.0.0.1:{registry}")), "{stdout}");
    assert!(stdout.contains(&format!("broker metrics   http://127.0.0.1:{metrics}/metrics")), "{stdout}");
    assert!(dir.path().join("fjord-data/meta.properties").exists());
    // The broker stops after the gateway, so the gateway's final audit flush reaches it; and
    // the embedded store's directory in the log dir is expected, not warned about.
    assert!(!stdout.contains("final audit flush failed"), "{stdout}");
    // Nor the broker's (the broker tier is on in `dev`).
    assert!(!stdout.contains("audit: final flush") && !stdout.contains("audit publisher panicked"), "{stdout}");
    assert!(!stdout.contains("ignoring a directory"), "{stdout}");
}

#[test]
fn broker_refuses_bad_flags_with_a_clear_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_fjord")).args(["broker", "--id", "0"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--listen"));
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["broker", "--id", "0", "--listen", "not-an-address", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("listeners"), "{}", String::from_utf8_lossy(&output.stderr));
    let output = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["broker", "--id", "0", "--listen", "127.0.0.1:0", "--metrics", "nowhere", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("metrics.listen"), "{}", String::from_utf8_lossy(&output.stderr));
}

/// `fjord broker` with its data under `dir`, `queued.max.request.bytes` at 64 MiB and its
/// metrics served; (the process, its Kafka port, its metrics port).
fn start_bounded_broker(dir: &std::path::Path) -> (common::FjordProcess, u16, u16) {
    let (port, metrics_port) = (free_port(), free_port());
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let env = [("FJORD_QUEUED_MAX_REQUEST_BYTES", "67108864"), ("FJORD_METRICS_LISTEN", metrics_listen.as_str())];
    (start_broker(port, &dir.join("data"), &env), port, metrics_port)
}

/// Resident memory of process `pid`, in bytes.
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/PID/status");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Connects and sends a frame that claims `size` bytes, then all of its body but the last
/// byte, giving up on a write the broker does not take within a second; returns the open
/// connection and the bytes the broker took.
fn half_send(addr: SocketAddr, size: usize) -> (std::net::TcpStream, usize) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    stream.write_all(&(size as i32).to_be_bytes()).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut sent = 0;
    while sent < size - 1 {
        let n = chunk.len().min(size - 1 - sent);
        match stream.write(&chunk[..n]) {
            Ok(n) => sent += n,
            Err(_) => break, // timed out: the broker stopped reading this connection
        }
    }
    (stream, sent)
}

#[test]
fn a_flood_of_large_half_sent_requests_leaves_the_broker_memory_bounded() {
    // 24 clients each send a 32 MiB frame but its last byte: 768 MiB a broker would hold
    // if it read them all (it did before queued.max.request.bytes), against a bound of
    // 64 MiB here. Small requests go on meanwhile, and once the clients give up, large
    // ones are read again.
    const MIB: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (broker, port, metrics_port) = start_bounded_broker(dir.path());
    let bootstrap = format!("127.0.0.1:{port}");
    produce(&bootstrap, "steady", 0..10);
    let before = resident_bytes(broker.id());

    let addr: SocketAddr = bootstrap.parse().unwrap();
    let flood: Vec<_> = (0..24).map(|_| std::thread::spawn(move || half_send(addr, 32 * MIB))).collect();
    let flood: Vec<_> = flood.into_iter().map(|t| t.join().unwrap()).collect();
    let taken: usize = flood.iter().map(|(_, sent)| sent).sum();
    let grown = resident_bytes(broker.id()).saturating_sub(before);
    assert!(
        grown < 192 * MIB as u64,
        "the broker grew by {} MiB holding a flood of {} MiB (bound 64 MiB)",
        grown / MIB as u64,
        taken / MIB
    );
    let page = metrics(metrics_port);
    let held = page.lines().find_map(|l| l.strip_prefix("fjord_broker_request_memory_bytes{pool=\"frames\"} ")).unwrap();
    assert!(held.parse::<u64>().unwrap() <= 64 * MIB as u64, "held {held}");
    assert!(!page.contains("fjord_broker_request_memory_waits_total 0\n"), "no frame waited:\n{page}");

    // Small requests (kcat's metadata, produce and fetch) are answered while the flood waits.
    produce(&bootstrap, "steady", 10..20);
    assert_eq!(consume_all(&bootstrap, "steady"), expected(0..20));

    // The flood goes; its memory comes back, and a large request (a 512 KiB record, over
    // the 64 KiB below which frames are not counted) goes through.
    drop(flood);
    let big = format!("{}\n", "x".repeat(MIB / 2));
    kcat(&["-b", &bootstrap, "-P", "-t", "steady", "-p", "0", "-X", "acks=all"], Some(&big));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !metrics(metrics_port).contains("fjord_broker_request_memory_bytes{pool=\"frames\"} 0\n") {
        assert!(Instant::now() < deadline, "the flood's memory did not come back");
        std::thread::sleep(Duration::from_millis(100));
    }
    let last = kcat(&["-b", &bootstrap, "-C", "-t", "steady", "-p", "0", "-o", "-1", "-e", "-q", "-f", "%S\n"], None);
    assert_eq!(last.trim(), (MIB / 2).to_string(), "the large record is stored whole");
}

/// Sends a Metadata v1 request naming `names` empty topics (two bytes each, about 200 once
/// decoded and answered) and reads the answer; the answer's size.
fn metadata_of_empty_names(addr: SocketAddr, names: usize) -> std::io::Result<usize> {
    use std::io::Read;
    let mut frame = Vec::with_capacity(14 + 4 + 2 * names);
    frame.extend(3i16.to_be_bytes()); // Metadata
    frame.extend(1i16.to_be_bytes()); // v1
    frame.extend(7i32.to_be_bytes()); // correlation id
    frame.extend(4i16.to_be_bytes());
    frame.extend(b"test");
    frame.extend((names as i32).to_be_bytes());
    frame.resize(frame.len() + 2 * names, 0);
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.write_all(&(frame.len() as i32).to_be_bytes())?;
    stream.write_all(&frame)?;
    let mut size = [0u8; 4];
    stream.read_exact(&mut size)?;
    let size = i32::from_be_bytes(size) as usize;
    std::io::copy(&mut stream.take(size as u64), &mut std::io::sink())?;
    Ok(size)
}

#[test]
fn requests_of_many_small_elements_are_decoded_within_the_memory_bound() {
    // 8 clients at once each ask for 990,000 topics with empty names: 1.9 MiB frames, but
    // ~200 MiB each decoded and answered. A bound of 64 MiB lets one decode at a time
    // (measured: the broker grew by 235 MiB; 425 MiB without the bound, where the
    // broker's two threads decoded two at a time).
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (broker, port, metrics_port) = start_bounded_broker(dir.path());
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let before = resident_bytes(broker.id());
    let pid = broker.id();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(resident_bytes(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let clients: Vec<_> = (0..8).map(|_| std::thread::spawn(move || metadata_of_empty_names(addr, 990_000))).collect();
    for client in clients {
        assert!(client.join().unwrap().unwrap() > 990_000, "every request is answered");
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let grown = watcher.join().unwrap().saturating_sub(before);
    assert!(grown < 330 * MIB, "the broker grew by {} MiB answering 8 requests of 990,000 elements", grown / MIB);
    let page = metrics(metrics_port);
    assert!(!page.contains("fjord_broker_request_memory_waits_total 0\n"), "no request waited:\n{page}");
    // Over a million elements is refused outright: that connection is closed, the broker goes on.
    assert!(metadata_of_empty_names(addr, 1_000_001).is_err(), "a request of 1,000,001 elements is not answered");
    assert!(metadata_of_empty_names(addr, 10).unwrap() > 0);
}
