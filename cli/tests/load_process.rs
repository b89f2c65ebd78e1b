//! `fjord load` as a real process: kill -9 at random moments, rerun until it exits 0, and
//! the destination holds every record exactly once (read back with fastavro).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::free_port;

fn start_broker(port: u16, data_dir: &Path) -> common::FjordProcess {
    common::start_broker(port, data_dir, &[])
}

fn fjord(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fjord")).args(args).env("RUST_LOG", "warn").output().unwrap()
}

fn kcat_produce(bootstrap: &str, topic: &str, lines: &str) {
    let mut child = Command::new("kcat")
        .args(["-b", bootstrap, "-P", "-t", topic, "-X", "acks=all"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat must be installed (cargo xtask test installs it)");
    child.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kcat: {}", String::from_utf8_lossy(&out.stderr));
}

/// (partition, offset, timestamp, value, hour dir) of every record in the destination,
/// read by fastavro; panics on records in the wrong file.
fn read_back(dest: &Path) -> Vec<(i64, i64, String)> {
    let py = fjord_testkit::python().unwrap();
    let out = Command::new(&py)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../hadoop-loader/tests/read_back.py"))
        .arg(dest)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} (set FJORD_TEST_PYTHON to a python with fastavro): {e}", py.display()));
    assert!(out.status.success(), "read_back.py: {}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut records = Vec::new();
    for f in doc["files"].as_array().unwrap() {
        let path = f["path"].as_str().unwrap();
        let (dir, name) = path.rsplit_once('/').unwrap();
        let (_, partition, first, last) = fjord_hadoop_loader::layout::parse_data_file_name(name).unwrap();
        let rs = f["records"].as_array().unwrap();
        assert_eq!(rs.first().unwrap()[1].as_i64(), Some(first), "{path}");
        assert_eq!(rs.last().unwrap()[1].as_i64(), Some(last), "{path}");
        for r in rs {
            assert_eq!(r[0].as_i64(), Some(i64::from(partition)), "{path}");
            let hour = fjord_hadoop_loader::layout::hour_path(r[2].as_i64().unwrap());
            assert_eq!(dir, format!("events/hourly/{hour}"), "{path}");
            records.push((r[0].as_i64().unwrap(), r[1].as_i64().unwrap(), r[3].as_str().unwrap().to_string()));
        }
    }
    records
}

fn check_exactly_once(dest: &Path, produced: usize) {
    let records = read_back(dest);
    let values: BTreeSet<&str> = records.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(values.len(), records.len(), "duplicate records");
    assert_eq!(records.len(), produced, "records missing or extra");
    let mut per_partition: BTreeMap<i64, BTreeSet<i64>> = BTreeMap::new();
    for (p, o, _) in &records {
        assert!(per_partition.entry(*p).or_default().insert(*o), "offset {p}/{o} twice");
    }
    for (p, offsets) in per_partition {
        // Offsets of a partition are 0..n without gaps: nothing lost between runs.
        assert_eq!(
            offsets.iter().copied().collect::<Vec<_>>(),
            (0..offsets.len() as i64).collect::<Vec<_>>(),
            "partition {p} has gaps"
        );
    }
}

#[test]
fn kill_9_at_random_moments_then_rerun_is_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let _broker = start_broker(port, &dir.path().join("broker"));
    let out = fjord(&["topics", "--bootstrap", &bootstrap, "create", "--topic", "events", "--partitions", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dest = dir.path().join("dest");
    let url = format!("file://{}", dest.display());
    let load = ["load", "--bootstrap", &bootstrap, "--topics", "events", "--dest", &url, "--job", "hourly"];
    // Killed runs are capped so they all take about as long as the measured one.
    let capped = [&load[..], &["--max-records", "5000"]].concat();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("seed {seed}");
    let mut state = seed;
    let mut killed = 0;
    // Each round adds 5,000 records, so every run has work when the kill comes. Round 0
    // runs to the end to measure how long a run takes; later rounds are killed at a random
    // moment within that time (connecting, reading, writing, moving or committing).
    let mut full_run = Duration::ZERO;
    for round in 0..15 {
        let lines: String = (round * 5_000..(round + 1) * 5_000).map(|i| format!("event-{i}\n")).collect();
        kcat_produce(&bootstrap, "events", &lines);
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_fjord"))
            .args(&capped)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if round == 0 {
            assert!(child.wait().unwrap().success());
            full_run = started.elapsed();
            eprintln!("an unkilled run of 5,000 records took {full_run:?}");
            continue;
        }
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        std::thread::sleep(Duration::from_micros((state >> 33) % (full_run.as_micros() as u64 + 1)));
        if child.try_wait().unwrap().is_none() {
            // SIGKILL: no destructor, no flush, no cleanup.
            child.kill().unwrap();
            killed += 1;
        }
        child.wait().unwrap();
    }
    eprintln!("{killed} of 14 runs killed with SIGKILL");
    assert!(killed >= 5, "too few runs were killed mid-way ({killed}) for the test to mean much");
    // Rerun until a run finds nothing new; every completed run exits 0.
    for attempt in 0.. {
        assert!(attempt < 10, "the job did not finish");
        let out = fjord(&load);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "fjord load failed: {}{}", stdout, String::from_utf8_lossy(&out.stderr));
        eprint!("{stdout}");
        if stdout.contains("nothing new to commit") {
            break;
        }
    }
    check_exactly_once(&dest, 75_000);

    // More records: the next run adds only those.
    let lines: String = (75_000..76_000).map(|i| format!("event-{i}\n")).collect();
    kcat_produce(&bootstrap, "events", &lines);
    let out = fjord(&load);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(": 1000 records (0 bad)"), "{}", String::from_utf8_lossy(&out.stdout));
    check_exactly_once(&dest, 76_000);
}

#[test]
fn unreachable_namenode_exits_non_zero_within_seconds() {
    let port = free_port();
    let url = format!("hdfs://127.0.0.1:{port}/data");
    let t = Instant::now();
    let out = fjord(&["load", "--bootstrap", "127.0.0.1:1", "--topics", "x", "--dest", &url, "--hdfs-timeout", "3s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    assert!(stderr.contains(&format!("namenode 127.0.0.1:{port}")), "{stderr}");
}
