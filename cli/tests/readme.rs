//! The README's commands run as written, in the README's order, against `fjord dev`
//! (issue #25), so the README and the binary cannot drift apart. Every `sh` block from
//! "Quickstart with kcat" up to "Mirror online clusters" runs: each command must exit 0,
//! no HTTP answer may be an error document, and where the README shows an answer
//! (`# → {...}` without `...`) the answer must equal it.
//!
//! Changes from the text, each for the test's sake: the services listen on free ports
//! (the README's fixed ports are rewritten), `fjord` is the binary under test, the bench
//! sends 20,000 messages instead of a million (a debug build), and the `events.ndjson`
//! the gzip example compresses is written first.

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, wait_until_listening, FjordProcess};

/// One command of a block: the text (continuation lines joined) and the answer the README
/// shows for it, if any.
#[derive(Debug)]
struct Step {
    command: String,
    expected: Option<String>,
}

/// The `sh` blocks between the two headings, as commands in order.
fn steps(readme: &str, from: &str, to: &str) -> Vec<Step> {
    let start = readme.find(from).unwrap_or_else(|| panic!("README has no {from:?}"));
    let end = readme[start..].find(to).map_or(readme.len(), |i| start + i);
    let mut steps: Vec<Step> = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in readme[start..end].lines() {
        if line.starts_with("```") {
            in_block = !in_block && line.trim() == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let trimmed = line.trim();
        if let Some(answer) = trimmed.strip_prefix("# →") {
            if let Some(last) = steps.last_mut() {
                last.expected = Some(answer.trim().to_owned());
            }
            continue;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => pending.push_str(part),
            None => {
                pending.push_str(trimmed);
                steps.push(Step { command: std::mem::take(&mut pending), expected: None });
            }
        }
    }
    steps
}

/// Runs `command` with bash in `dir`, `PATH` starting with `bin`; (exit ok, stdout, stderr).
fn run(command: &str, dir: &Path, bin: &Path) -> (bool, String, String) {
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = Command::new("bash")
        .args(["-o", "pipefail", "-c", command])
        .current_dir(dir)
        .env("PATH", path)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let stdout = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        text
    });
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`{command}` did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.success(), stdout.join().unwrap(), stderr.join().unwrap())
}

#[test]
fn the_readme_commands_run_as_written_against_fjord_dev() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, registry, http, grpc, metrics) = (free_port(), free_port(), free_port(), free_port(), free_port());
    let mut dev = FjordProcess(
        Command::new(env!("CARGO_BIN_EXE_fjord"))
            .args(["dev", "--data-dir"])
            .arg(dir.path().join("fjord-data"))
            .args(["--registry", &format!("127.0.0.1:{registry}"), "--http", &format!("127.0.0.1:{http}")])
            .args(["--grpc", &format!("127.0.0.1:{grpc}"), "--metrics", &format!("127.0.0.1:{metrics}")])
            .env("FJORD_LISTENERS", format!("127.0.0.1:{broker}"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for port in [broker, registry, http, grpc, metrics] {
        wait_until_listening(SocketAddr::from(([127, 0, 0, 1], port)), &mut dev);
    }
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_fjord"), bin.join("fjord")).unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("events.ndjson"), "{\"user\":\"u3\",\"page\":\"/c\"}\n{\"user\":\"u4\",\"page\":\"/d\"}\n").unwrap();

    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let steps = steps(&readme, "## Quickstart with kcat", "## Mirror online clusters");
    assert!(steps.len() >= 15, "the README's quickstart blocks were found: {steps:#?}");
    let mut ran = 0;
    for step in steps {
        if step.command.starts_with("cargo run") {
            continue; // `fjord dev` is already running
        }
        let command = step
            .command
            .replace("127.0.0.1:9092", &format!("127.0.0.1:{broker}"))
            .replace("127.0.0.1:8081", &format!("127.0.0.1:{registry}"))
            .replace("127.0.0.1:8082", &format!("127.0.0.1:{http}"))
            .replace("--messages 1000000", "--messages 20000");
        let (ok, stdout, stderr) = run(&command, &work, &bin);
        assert!(ok, "README command failed: {}\nstdout: {stdout}\nstderr: {stderr}", step.command);
        let answer: Option<serde_json::Value> = serde_json::from_str(stdout.trim()).ok();
        let error = answer.as_ref().and_then(|a| a.get("error_code")).is_some_and(|code| !code.is_null());
        assert!(!error, "README command answered an error: {}\n{stdout}", step.command);
        if let Some(expected) = step.expected.filter(|e| !e.contains("...")) {
            let want: serde_json::Value = serde_json::from_str(&expected).unwrap();
            let got = answer.unwrap_or_else(|| panic!("{}: answer is not JSON: {stdout}", step.command));
            assert_eq!(got, want, "README shows another answer for: {}", step.command);
        }
        ran += 1;
    }
    assert!(ran >= 14, "only {ran} README commands ran");
}
