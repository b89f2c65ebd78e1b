//! `fjord topics|produce|consume|bench` as a user runs them, against an in-process broker,
//! and cross-checked with kcat (librdkafka), an independent Kafka client.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fjord_testkit::StandaloneBroker;

const KCAT: &str = "kcat";

async fn start_broker() -> StandaloneBroker {
    StandaloneBroker::start().await.expect("broker starts")
}

/// Runs a program off the runtime's threads (the broker keeps serving meanwhile).
async fn run(program: &str, args: &[&str], stdin: &str) -> Output {
    let (program, args, stdin) = (program.to_string(), args.iter().map(|s| s.to_string()).collect::<Vec<_>>(), stdin.to_string());
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(&program)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {program} (kcat comes from `apt-get install kcat`): {e}"));
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

async fn fjord(args: &[&str], stdin: &str) -> String {
    let out = run(env!("CARGO_BIN_EXE_fjord"), args, stdin).await;
    assert!(out.status.success(), "fjord {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

async fn kcat(args: &[&str], stdin: &str) -> String {
    let out = run(KCAT, args, stdin).await;
    assert!(out.status.success(), "kcat {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn sorted_lines(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s.lines().map(String::from).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fjord_produce_is_read_by_kcat_and_kcat_produce_by_fjord_consume() {
    let b = start_broker().await;
    fjord(&["topics", "--bootstrap", &b.addr, "create", "--topic", "x", "--partitions", "2"], "").await;
    let input: String = (0..50).map(|i| format!("key{i}|value {i}\n")).collect();
    fjord(&["produce", "--bootstrap", &b.addr, "--topic", "x", "--key-separator", "|", "--header", "origin=fjord"], &input).await;
    let read = kcat(&["-b", &b.addr, "-C", "-t", "x", "-e", "-q", "-f", "%k|%s|%h\n"], "").await;
    let expected: String = (0..50).map(|i| format!("key{i}|value {i}|origin=fjord\n")).collect();
    assert_eq!(sorted_lines(&read), sorted_lines(&expected));

    fjord(&["topics", "--bootstrap", &b.addr, "create", "--topic", "y", "--partitions", "1"], "").await;
    let input: String = (0..50).map(|i| format!("k{i}:from kcat {i}\n")).collect();
    kcat(&["-b", &b.addr, "-P", "-t", "y", "-K", ":", "-z", "snappy"], &input).await;
    let out = fjord(
        &["consume", "--bootstrap", &b.addr, "--topic", "y", "--from", "beginning", "--max-messages", "50", "--format", "json"],
        "",
    )
    .await;
    let records: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 50);
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r["offset"], i as i64);
        assert_eq!(r["key"], format!("k{i}"));
        assert_eq!(r["value"], format!("from kcat {i}"));
    }
    // Plain output and starting from an offset.
    let out = fjord(&["consume", "--bootstrap", &b.addr, "--topic", "y", "--from", "48", "--max-messages", "2"], "").await;
    assert_eq!(out, "from kcat 48\nfrom kcat 49\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_keys_land_on_the_same_partitions_as_with_kcat_murmur2_random() {
    let b = start_broker().await;
    fjord(&["topics", "--bootstrap", &b.addr, "create", "--topic", "keys", "--partitions", "7"], "").await;
    let input: String = (0..100).map(|i| format!("user-{i}:x\n")).collect();
    fjord(&["produce", "--bootstrap", &b.addr, "--topic", "keys", "--key-separator", ":", "--header", "by=fjord"], &input).await;
    kcat(&["-b", &b.addr, "-P", "-t", "keys", "-K", ":", "-X", "partitioner=murmur2_random", "-H", "by=kcat"], &input).await;
    let read = kcat(&["-b", &b.addr, "-C", "-t", "keys", "-e", "-q", "-f", "%k %p %h\n"], "").await;
    let mut fjord_p = std::collections::BTreeMap::new();
    let mut kcat_p = std::collections::BTreeMap::new();
    for line in read.lines() {
        let mut parts = line.split(' ');
        let (key, partition, by) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        let map = if by == "by=fjord" { &mut fjord_p } else { &mut kcat_p };
        map.insert(key.to_string(), partition.to_string());
    }
    assert_eq!(fjord_p.len(), 100);
    assert_eq!(fjord_p, kcat_p);
    let used: std::collections::BTreeSet<_> = fjord_p.values().collect();
    assert!(used.len() > 3, "keys spread over partitions: {used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_subcommands_and_one_line_errors() {
    let b = start_broker().await;
    let created = fjord(
        &["topics", "--bootstrap", &b.addr, "create", "--topic", "t", "--partitions", "3", "--config", "retention.ms=60000"],
        "",
    )
    .await;
    assert_eq!(created, "created topic t\n");
    assert_eq!(fjord(&["topics", "--bootstrap", &b.addr, "list"], "").await, "t\n");
    let described = fjord(&["topics", "--bootstrap", &b.addr, "describe", "t"], "").await;
    assert!(described.contains("partitions 3") && described.contains("retention.ms=60000"), "{described}");
    // Already exists: one line on stderr, non-zero exit.
    let out = run(env!("CARGO_BIN_EXE_fjord"), &["topics", "--bootstrap", &b.addr, "create", "--topic", "t"], "").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("TopicAlreadyExists"), "{stderr}");
    // Alter: changes the named keys only; a bad value is one line naming key and value.
    let altered = fjord(
        &[
            "topics",
            "--bootstrap",
            &b.addr,
            "alter",
            "t",
            "--config",
            "max.message.bytes=5000",
            "--config",
            "cleanup.policy=compact",
        ],
        "",
    )
    .await;
    assert_eq!(altered, "altered topic t\n");
    let described = fjord(&["topics", "--bootstrap", &b.addr, "describe", "t"], "").await;
    for expected in ["retention.ms=60000", "max.message.bytes=5000", "cleanup.policy=compact"] {
        assert!(described.contains(expected), "{expected} missing from {described}");
    }
    let out =
        run(env!("CARGO_BIN_EXE_fjord"), &["topics", "--bootstrap", &b.addr, "alter", "t", "--config", "retention.ms=soon"], "")
            .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("retention.ms=soon"), "{stderr}");
    // Alter --partitions raises the count (CreatePartitions); a lower one is refused in one line.
    let grown = fjord(&["topics", "--bootstrap", &b.addr, "alter", "t", "--partitions", "5"], "").await;
    assert_eq!(grown, "topic t now has 5 partitions\n");
    let described = fjord(&["topics", "--bootstrap", &b.addr, "describe", "t"], "").await;
    assert!(described.contains("partitions 5"), "{described}");
    let out = run(env!("CARGO_BIN_EXE_fjord"), &["topics", "--bootstrap", &b.addr, "alter", "t", "--partitions", "2"], "").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("InvalidPartitions") || stderr.contains("partitions"), "{stderr}");
    fjord(&["topics", "--bootstrap", &b.addr, "delete", "t"], "").await;
    assert_eq!(fjord(&["topics", "--bootstrap", &b.addr, "list"], "").await, "");
    // Consuming a missing topic does not create it.
    let out = run(env!("CARGO_BIN_EXE_fjord"), &["consume", "--bootstrap", &b.addr, "--topic", "missing"], "").await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown topic missing"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_bootstrap_is_a_clear_error_in_bounded_time() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let started = Instant::now();
    let out = run(env!("CARGO_BIN_EXE_fjord"), &["produce", "--bootstrap", &addr, "--topic", "t"], "x\n").await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no bootstrap broker reachable") && stderr.contains(&addr), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_reports_json_for_produce_consume_and_e2e() {
    let b = start_broker().await;
    for mode in ["produce", "consume", "e2e"] {
        let out = fjord(
            &[
                "bench",
                mode,
                "--bootstrap",
                &b.addr,
                "--topic",
                "b",
                "--messages",
                "2000",
                "--size",
                "100",
                "--batch",
                "50",
                "--json",
            ],
            "",
        )
        .await;
        let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{mode}: {e}: {out}"));
        assert_eq!(report["messages"], 2000, "{mode}");
        assert_eq!(report["bytes"], 200_000, "{mode}");
        for field in ["seconds", "msg_per_s", "mb_per_s", "p50_ms", "p99_ms", "p999_ms", "max_ms"] {
            assert!(report[field].as_f64().is_some_and(|v| v >= 0.0), "{mode}: {field} in {report}");
        }
        assert!(report["p50_ms"].as_f64() <= report["p999_ms"].as_f64());
        assert!(report["p999_ms"].as_f64() <= report["max_ms"].as_f64());
        assert_eq!(report["open_loop"], false, "{mode}");
    }
}

/// `--transaction-records` with `--producers`: every message is measured (send → commit)
/// and committed, as a read_committed consumer (kcat) sees; without `--acks all` or with
/// `--rate` it is refused, as are `--producers` with `--rate` and a batch over 256 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_produces_in_transactions_from_several_producers() {
    let b = start_broker().await;
    fjord(&["topics", "--bootstrap", &b.addr, "create", "--topic", "tx", "--partitions", "2"], "").await;
    let args = [
        "bench",
        "produce",
        "--bootstrap",
        &b.addr,
        "--topic",
        "tx",
        "--messages",
        "1001",
        "--size",
        "100",
        "--acks",
        "all",
        "--transaction-records",
        "100",
        "--producers",
        "3",
        "--json",
    ];
    let report: serde_json::Value = serde_json::from_str(fjord(&args, "").await.trim()).unwrap();
    assert_eq!((report["messages"].as_u64(), report["latency_samples"].as_u64()), (Some(1001), Some(1001)), "{report}");
    let committed = kcat(
        &[
            "-C",
            "-b",
            &b.addr,
            "-t",
            "tx",
            "-o",
            "beginning",
            "-e",
            "-q",
            "-X",
            "isolation.level=read_committed",
            "-f",
            "%p %o\n",
        ],
        "",
    )
    .await;
    assert_eq!(committed.lines().count(), 1001, "{committed}");
    // Transactions need acks=all and a closed loop, as several producers do; a batch over
    // 256 MiB is refused before a buffer that size is built.
    for (refused, why) in [
        (&["--transaction-records", "5", "--acks", "1"][..], "needs --acks all"),
        (&["--transaction-records", "5", "--acks", "all", "--rate", "100"][..], "without --rate"),
        (&["--producers", "2", "--rate", "100"][..], "--producers applies to produce without --rate"),
        (&["--batch", "2000000", "--size", "200"][..], "bytes a batch"),
    ] {
        let mut args = vec!["bench", "produce", "--bootstrap", &b.addr, "--topic", "tx", "--messages", "10"];
        args.extend_from_slice(refused);
        let out = run(env!("CARGO_BIN_EXE_fjord"), &args, "").await;
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains(why), "{args:?}: {out:?}");
    }
}

/// `--rate`: the sends follow the schedule (1000 messages at 4000/s cannot finish before
/// the last one is due, 250 ms in), every message is measured, and `--broker-pid` (the
/// broker runs in this test's process) adds the broker's CPU per message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_open_loop_keeps_the_rate_and_reports_broker_cpu() {
    let b = start_broker().await;
    let pid = std::process::id().to_string();
    for mode in ["produce", "e2e"] {
        let args = [
            "bench",
            mode,
            "--bootstrap",
            &b.addr,
            "--topic",
            "open",
            "--messages",
            "1000",
            "--size",
            "100",
            "--rate",
            "4000",
            "--broker-pid",
            &pid,
            "--json",
        ];
        let out = fjord(&args, "").await;
        let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{mode}: {e}: {out}"));
        assert_eq!((report["messages"].as_u64(), report["open_loop"].as_bool()), (Some(1000), Some(true)), "{report}");
        assert_eq!(report["target_msg_per_s"], 4000, "{report}");
        assert_eq!(report["latency_samples"], 1000, "every message is measured: {report}");
        assert!(report["seconds"].as_f64().unwrap() >= 0.2497, "faster than the schedule: {report}");
        assert!(report["msg_per_s"].as_f64().unwrap() <= 4010.0, "{report}");
        assert!(report["p50_ms"].as_f64() <= report["max_ms"].as_f64(), "{report}");
        assert!(report["broker_cpu_us_per_msg"].as_f64().is_some_and(|us| us >= 0.0), "{report}");
        assert!(report["client_cpu_us_per_msg"].as_f64().is_some_and(|us| us >= 0.0), "{report}");
    }
    let out =
        run(env!("CARGO_BIN_EXE_fjord"), &["bench", "consume", "--bootstrap", &b.addr, "--messages", "1", "--rate", "5"], "")
            .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rate applies to produce and e2e"));
    let out = run(
        env!("CARGO_BIN_EXE_fjord"),
        &["bench", "produce", "--bootstrap", &b.addr, "--messages", "1", "--broker-pid", "4294967295"],
        "",
    )
    .await;
    assert!(!out.status.success(), "an unreadable broker pid is an error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("process 4294967295"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_with_a_group_resumes_after_what_it_printed() {
    let b = start_broker().await;
    fjord(&["topics", "--bootstrap", &b.addr, "create", "--topic", "g", "--partitions", "3"], "").await;
    let input: String = (0..30).map(|i| format!("record {i}\n")).collect();
    fjord(&["produce", "--bootstrap", &b.addr, "--topic", "g"], &input).await;
    // Each run a member of group "readers": the second starts where the first's printing
    // stopped (it commits what it printed, not what it polled), so together they print
    // every record once. `timeout`: a second run finding nothing would wait forever.
    let fjord_bin = env!("CARGO_BIN_EXE_fjord");
    let member = |max: &'static str| {
        let addr = b.addr.clone();
        async move {
            let args = ["30", fjord_bin, "consume", "--bootstrap", &addr, "--topic", "g", "--group", "readers"];
            let out = run("timeout", &[&args[..], &["--from", "beginning", "--max-messages", max]].concat(), "").await;
            assert!(out.status.success(), "fjord consume --group failed: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap()
        }
    };
    let first = member("10").await;
    let second = member("20").await;
    assert_eq!(first.lines().count(), 10, "{first}");
    let mut all: Vec<String> = first.lines().chain(second.lines()).map(String::from).collect();
    all.sort();
    let mut expected: Vec<String> = (0..30).map(|i| format!("record {i}")).collect();
    expected.sort();
    assert_eq!(all, expected, "every record once across the two runs");
    // The group's committed offsets cover the topic: kcat, joining the group, starts at
    // them (at the beginning, were there none) and finds nothing to read.
    let committed = kcat(&["-b", &b.addr, "-q", "-e", "-X", "auto.offset.reset=earliest", "-G", "readers", "g"], "").await;
    assert_eq!(committed, "", "nothing left after the committed offsets");

    // A position other than beginning/end makes no sense for a group; --partition conflicts.
    let out = run(fjord_bin, &["consume", "--bootstrap", &b.addr, "--topic", "g", "--group", "x", "--from", "5"], "").await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("beginning or end"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(fjord_bin, &["consume", "--bootstrap", &b.addr, "--topic", "g", "--group", "x", "--partition", "0"], "").await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--partition"), "{}", String::from_utf8_lossy(&out.stderr));
}
