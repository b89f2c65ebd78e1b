//! The CLI reads like the README (issue #25): connection flags go after the action too
//! (`fjord topics create --bootstrap ...`), Kafka's `--bootstrap-server` is accepted, and
//! a log that is not going to a terminal has no colour codes (`--log-format json` gives
//! one JSON object per line). Each runs the real binary.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, start_broker, wait_until_listening, FjordProcess};

fn fjord(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fjord")).args(args).env_remove("FJORD_BOOTSTRAP").output().unwrap()
}

fn succeeded(args: &[&str]) -> String {
    let output = fjord(args);
    assert!(output.status.success(), "fjord {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn connection_flags_are_accepted_after_the_action() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let _broker = start_broker(port, &dir.path().join("data"), &[]);

    // The README's quickstart line, as written.
    let created = succeeded(&["topics", "create", "--bootstrap", &bootstrap, "--topic", "clicks", "--partitions", "4"]);
    assert_eq!(created, "created topic clicks\n");
    // Kafka's spelling, after the topic argument, and in `=` form.
    let described = succeeded(&["topics", "describe", "clicks", "--bootstrap-server", &bootstrap]);
    assert!(described.starts_with("topic clicks  partitions 4\n"), "{described}");
    let listed = succeeded(&["topics", "list", &format!("--bootstrap-server={bootstrap}"), "--connect-timeout-ms", "2000"]);
    assert_eq!(listed, "clicks\n");
    // Before the action, as before.
    assert_eq!(succeeded(&["topics", "--bootstrap", &bootstrap, "list"]), "clicks\n");
    // Groups: a group nobody joined is described as empty, not refused as a bad flag.
    let groups = fjord(&["groups", "describe", "g", "--bootstrap", &bootstrap]);
    let stderr = String::from_utf8_lossy(&groups.stderr);
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
    assert!(groups.status.success(), "{stderr}");
    succeeded(&["groups", "list", "--bootstrap-server", &bootstrap]);
    // The flag still goes where it was pointed: a wrong address fails, it is not ignored.
    let unreachable = format!("127.0.0.1:{}", free_port());
    let refused = fjord(&["topics", "list", "--bootstrap", &unreachable, "--connect-timeout-ms", "500"]);
    assert!(!refused.status.success(), "listing from a port nobody listens on fails");
}

/// `fjord broker` with its stdout redirected to a file (`extra` flags added), until
/// its log says it started; returns the log.
fn broker_log(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log_path = dir.path().join("broker.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["broker", "--id", "0", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir.path().join("data"))
        .args(extra)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::from(log))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut broker = FjordProcess(child);
    wait_until_listening(SocketAddr::from(([127, 0, 0, 1], port)), &mut broker);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log_path).unwrap();
        if text.contains("broker started") {
            return text;
        }
        assert!(Instant::now() < deadline, "no `broker started` in the log:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_log_written_to_a_file_has_no_colour_codes() {
    let text = broker_log(&[]);
    assert!(!text.contains('\x1b'), "ANSI escape codes in a redirected log:\n{text}");
    assert!(text.lines().any(|l| l.contains("INFO") && l.contains("broker started")), "{text}");
}

#[test]
fn log_format_json_writes_one_object_per_line() {
    let text = broker_log(&["--log-format", "json"]);
    assert!(!text.contains('\x1b'), "{text}");
    let mut started = false;
    // A line still being written when the file was read has no newline yet.
    for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let event: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(event["level"].is_string() && event["timestamp"].is_string(), "{line}");
        started |= event["fields"]["message"] == "broker started";
    }
    assert!(started, "{text}");
}
