//! The workspace's tests, several test binaries at a time.
//!
//! `cargo test` runs one test binary after another. Most of ours spend their time
//! waiting (for brokers to start and elect, ZooKeeper sessions, client retries, fault
//! timeouts), not on the CPU: in a timing run of CI here they took 665 s, 11 of its 25
//! minutes, with the two cores ~75% idle; three at a time, 249 s at ~60% busy, each
//! binary within a few percent of its time alone. So the binaries are built the way
//! `cargo test` builds them, then run [`jobs`] at a time, each as `cargo test` runs it
//! (from its package's directory, with cargo's variables), its output kept in
//! `target/xtask/tests/` and printed whole when it ends, then a summary. Tests are
//! written to run side by side (ephemeral ports, their own temp dirs, network
//! namespaces named after their process), as they do within one binary already.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::cargo;

/// How many test binaries run at once unless `FJORD_TEST_JOBS` says otherwise.
const DEFAULT_JOBS: usize = 3;

/// A test binary still running after this is killed and counted as failed, its output
/// so far shown: a hang fails the run with its name instead of holding CI to its own
/// limit. The longest binary takes under two minutes; the tests' own phase limits are
/// two minutes each. (What the killed binary started itself, a broker or ZooKeeper
/// process, is left to end with the run.)
const JOB_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Binaries that took 15 s or more in CI (package, target), longest first: started
/// first, so that none of them is left to run alone at the end (the order of the rest
/// matters little). One missing here only costs time, never a test.
const LONGEST_FIRST: &[(&str, &str)] = &[
    ("fjord-testkit", "chaos_short"),
    ("fjord", "txn_cluster"),
    ("fjord-broker", "kafka_python_security"),
    ("fjord-broker", "quotas"),
    ("fjord-log", "open_files"),
    ("fjord", "cluster"),
    ("fjord", "mirror"),
    ("fjord-broker", "sasl"),
    ("fjord", "reassign"),
    ("fjord-broker", "log_dirs"),
    ("fjord-console", "browser"),
    ("fjord-console", "pages"),
];

/// One test binary, as `cargo test --no-run` reported it.
struct TestBinary {
    /// What `cargo test` prints for it: `unittests src/lib.rs` or `tests/groups.rs`.
    label: String,
    /// The target's name (`groups`, `fjord_broker`).
    name: String,
    package: String,
    version: String,
    executable: PathBuf,
    /// The package's directory: tests run from there, as under `cargo test`.
    dir: PathBuf,
}

/// What one job (a test binary, or the doc tests) came to.
struct Finished {
    label: String,
    success: bool,
    took: Duration,
    output: String,
}

/// Builds every test binary of the workspace, runs them [`jobs`] at a time and the doc
/// tests beside them, and fails when any test failed (after all of them ran, as
/// `--no-fail-fast` does).
pub(crate) fn run_workspace_tests(root: &Path, env: &[(&str, &Path)]) -> Result<()> {
    let binaries = build(root)?;
    let jobs = jobs()?;
    let logs = root.join("target/xtask/tests");
    fs::create_dir_all(&logs)?;
    let started = Instant::now();
    eprintln!("xtask: running {} test binaries and the doc tests, {jobs} at a time", binaries.len());

    let mut queue: VecDeque<Job> = order(binaries).into_iter().map(Job::Binary).collect();
    queue.push_back(Job::DocTests);
    let (done, finished) = mpsc::channel::<Result<Finished>>();
    let mut running = 0;
    let mut results = Vec::new();
    while running > 0 || !queue.is_empty() {
        while running < jobs {
            let Some(job) = queue.pop_front() else { break };
            let (root, logs, env) = (root.to_path_buf(), logs.clone(), owned(env));
            let done = done.clone();
            std::thread::spawn(move || {
                let _ = done.send(job.run(&root, &logs, &env, JOB_TIMEOUT));
            });
            running += 1;
        }
        let result = finished.recv().context("a test job's thread ended without an answer")?;
        running -= 1;
        let result = result?;
        println!("\n     Ran {} in {:.1}s\n{}", result.label, result.took.as_secs_f64(), result.output);
        results.push(result);
    }
    summarize(&results, started.elapsed())
}

fn owned(env: &[(&str, &Path)]) -> Vec<(String, PathBuf)> {
    env.iter().map(|(k, v)| ((*k).to_owned(), v.to_path_buf())).collect()
}

/// `FJORD_TEST_JOBS`, or [`DEFAULT_JOBS`].
fn jobs() -> Result<usize> {
    match std::env::var("FJORD_TEST_JOBS") {
        Ok(value) => match value.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("FJORD_TEST_JOBS must be a number of test binaries to run at once, at least 1 (got {value:?})"),
        },
        Err(_) => Ok(DEFAULT_JOBS),
    }
}

/// `cargo test --workspace --no-run`, reading the binaries from cargo's JSON messages
/// (its diagnostics still go to the terminal, rendered).
fn build(root: &Path) -> Result<Vec<TestBinary>> {
    let output = cargo(root)
        .args(["test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .context("could not run cargo test --no-run")?;
    if !output.status.success() {
        bail!("building the tests failed: {}", output.status);
    }
    let mut binaries = Vec::new();
    for line in output.stdout.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let message: Value = serde_json::from_slice(line).context("cargo printed a line that is not JSON")?;
        if let Some(binary) = test_binary(&message) {
            binaries.push(binary);
        }
    }
    if binaries.is_empty() {
        bail!("cargo test --no-run reported no test binaries");
    }
    Ok(binaries)
}

/// The test binary a `compiler-artifact` message names, if it names one.
fn test_binary(message: &Value) -> Option<TestBinary> {
    if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
        return None;
    }
    let executable = PathBuf::from(message["executable"].as_str()?);
    let target = &message["target"];
    let dir = Path::new(message["manifest_path"].as_str()?).parent()?.to_path_buf();
    let source = Path::new(target["src_path"].as_str()?);
    let source = source.strip_prefix(&dir).unwrap_or(source).display().to_string();
    let integration = target["kind"].as_array()?.iter().any(|k| k == "test");
    let (package, version) = package_and_version(message["package_id"].as_str()?, &dir)?;
    Some(TestBinary {
        label: if integration { source } else { format!("unittests {source}") },
        name: target["name"].as_str()?.to_owned(),
        package,
        version,
        executable,
        dir,
    })
}

/// Name and version from a package id: `path+file:///w/broker#fjord-broker@0.1.0`, or
/// `path+file:///w/xtask#0.1.0` when the name is the directory's.
fn package_and_version(id: &str, dir: &Path) -> Option<(String, String)> {
    let fragment = id.rsplit_once('#')?.1;
    Some(match fragment.split_once('@') {
        Some((name, version)) => (name.to_owned(), version.to_owned()),
        None => (dir.file_name()?.to_string_lossy().into_owned(), fragment.to_owned()),
    })
}

/// [`LONGEST_FIRST`] in its order, then the rest in cargo's.
fn order(mut binaries: Vec<TestBinary>) -> Vec<TestBinary> {
    let rank = |b: &TestBinary| {
        LONGEST_FIRST.iter().position(|&(package, name)| package == b.package && name == b.name).unwrap_or(LONGEST_FIRST.len())
    };
    binaries.sort_by_key(rank); // stable: cargo's order among the rest
    binaries
}

enum Job {
    Binary(TestBinary),
    DocTests,
}

impl Job {
    /// Runs the job, its output into `logs`; killed (and failed) after `limit`.
    fn run(self, root: &Path, logs: &Path, env: &[(String, PathBuf)], limit: Duration) -> Result<Finished> {
        let (label, log_name, mut cmd) = match &self {
            Job::Binary(b) => {
                let mut cmd = Command::new(&b.executable);
                cmd.current_dir(&b.dir)
                    .env("CARGO_MANIFEST_DIR", &b.dir)
                    .env("CARGO_PKG_NAME", &b.package)
                    .env("CARGO_PKG_VERSION", &b.version)
                    .env("CARGO_CRATE_NAME", &b.name);
                (format!("{} ({})", b.label, b.package), format!("{}-{}.log", b.package, b.name), cmd)
            }
            Job::DocTests => {
                let mut cmd = cargo(root);
                cmd.args(["test", "--workspace", "--doc"]);
                ("doc tests".to_owned(), "doc-tests.log".to_owned(), cmd)
            }
        };
        for (key, value) in env {
            cmd.env(key, value);
        }
        let path = logs.join(log_name);
        let log = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        let started = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("could not start {label}"))?;
        let success = loop {
            if let Some(status) = child.try_wait()? {
                break Some(status.success());
            }
            if started.elapsed() >= limit {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut output = fs::read(&path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        if success.is_none() {
            output.push_str(&format!("\nxtask: killed after {} s, the limit of one test job\n", limit.as_secs()));
        }
        Ok(Finished { label, success: success == Some(true), took: started.elapsed(), output })
    }
}

/// Counts of `test result:` lines: passed, failed, ignored.
fn counts(output: &str) -> (u64, u64, u64) {
    let mut sum = (0, 0, 0);
    for line in output.lines().filter_map(|l| l.strip_prefix("test result: ")) {
        let number = |what: &str| {
            line.split(';').find_map(|part| part.trim().strip_suffix(what)?.trim().rsplit(' ').next()?.parse::<u64>().ok())
        };
        sum.0 += number("passed").unwrap_or(0);
        sum.1 += number("failed").unwrap_or(0);
        sum.2 += number("ignored").unwrap_or(0);
    }
    sum
}

fn summarize(results: &[Finished], took: Duration) -> Result<()> {
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for r in results {
        let (p, f, i) = counts(&r.output);
        (passed, failed, ignored) = (passed + p, failed + f, ignored + i);
    }
    let failures: Vec<&str> = results.iter().filter(|r| !r.success).map(|r| r.label.as_str()).collect();
    // For keeping LONGEST_FIRST true.
    let mut slowest: Vec<&Finished> = results.iter().collect();
    slowest.sort_by_key(|r| std::cmp::Reverse(r.took));
    let slowest: Vec<String> = slowest.iter().take(8).map(|r| format!("{} {:.0} s", r.label, r.took.as_secs_f64())).collect();
    println!("\nslowest: {}", slowest.join(", "));
    println!(
        "{passed} tests passed, {failed} failed, {ignored} ignored, in {} test jobs ({:.0} s)",
        results.len(),
        took.as_secs_f64()
    );
    if failures.is_empty() {
        return Ok(());
    }
    for label in &failures {
        println!("    FAILED: {label}");
    }
    bail!("{} of {} test jobs failed: {}", failures.len(), results.len(), failures.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test binary `name` of `package`, nowhere on disk.
    fn binary((package, name): (&str, &str)) -> TestBinary {
        TestBinary {
            label: format!("tests/{name}.rs"),
            name: name.to_owned(),
            package: package.to_owned(),
            version: "0.1.0".to_owned(),
            executable: PathBuf::new(),
            dir: PathBuf::new(),
        }
    }

    #[test]
    fn a_binary_past_its_limit_is_killed_and_fails_with_its_output() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("xtask-testrun-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let script = dir.join("hangs");
        fs::write(&script, "#!/bin/sh\necho started\nexec sleep 60\n").unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let binary = TestBinary { executable: script, dir: dir.clone(), ..binary(("p", "hangs")) };
        let started = Instant::now();
        let finished = Job::Binary(binary).run(&dir, &dir, &[], Duration::from_secs(1)).unwrap();
        assert!(started.elapsed() < Duration::from_secs(30), "not killed at its limit");
        assert!(!finished.success);
        assert!(finished.output.starts_with("started\n"), "{}", finished.output);
        assert!(finished.output.contains("killed after 1 s"), "{}", finished.output);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn counts_add_up_every_test_result_line() {
        let output =
            "running 3 tests\ntest result: ok. 3 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.02s\n\
                      test result: FAILED. 4 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n";
        assert_eq!(counts(output), (7, 1, 2));
    }

    #[test]
    fn a_test_artifact_becomes_a_binary_run_from_its_package() {
        let message = serde_json::json!({
            "reason": "compiler-artifact",
            "package_id": "path+file:///w/broker#fjord-broker@0.1.0",
            "manifest_path": "/w/broker/Cargo.toml",
            "target": {"kind": ["test"], "name": "groups", "src_path": "/w/broker/tests/groups.rs"},
            "profile": {"test": true},
            "executable": "/w/target/debug/deps/groups-abc"
        });
        let binary = test_binary(&message).expect("a test binary");
        assert_eq!(binary.label, "tests/groups.rs");
        assert_eq!((binary.name.as_str(), binary.package.as_str(), binary.version.as_str()), ("groups", "fjord-broker", "0.1.0"));
        assert_eq!(binary.dir, Path::new("/w/broker"));
        let library = serde_json::json!({
            "reason": "compiler-artifact",
            "package_id": "path+file:///w/broker#fjord-broker@0.1.0",
            "manifest_path": "/w/broker/Cargo.toml",
            "target": {"kind": ["lib"], "name": "fjord_broker", "src_path": "/w/broker/src/lib.rs"},
            "profile": {"test": false},
            "executable": null
        });
        assert!(test_binary(&library).is_none(), "a library built for the tests is not one");
        assert_eq!(
            package_and_version("path+file:///w/xtask#0.1.0", Path::new("/w/xtask")),
            Some(("xtask".to_owned(), "0.1.0".to_owned()))
        );
    }

    #[test]
    fn the_longest_binaries_go_first_and_the_rest_keep_cargos_order() {
        let binaries =
            [("x", "b"), ("fjord", "mirror"), ("fjord-broker", "mirror"), ("x", "a"), ("fjord-testkit", "chaos_short")];
        let ordered = order(binaries.into_iter().map(binary).collect());
        let names: Vec<(&str, &str)> = ordered.iter().map(|b| (b.package.as_str(), b.name.as_str())).collect();
        assert_eq!(
            names,
            [("fjord-testkit", "chaos_short"), ("fjord", "mirror"), ("x", "b"), ("fjord-broker", "mirror"), ("x", "a")],
            "a name counts with its package only"
        );
    }
}
