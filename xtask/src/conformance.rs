//! `cargo xtask conformance`: librdkafka's own integration tests, unchanged, against
//! `fjord dev` (#27).
//!
//! - The tests come from the `rdkafka-sys` crate's vendored librdkafka (pinned below),
//!   fetched into the cargo registry with `cargo fetch` when missing. The tree is copied
//!   into `target/conformance/` and built there (`./configure`, `make libs`, the test
//!   runner); the registry copy is never written to.
//! - A `fjord dev` on free ports serves each run, with `num.partitions=4` as the suite's
//!   own scenarios set (and `auto.create.topics.enable=false` for `noautocreate`).
//! - Each test runs alone (`TESTS=NNNN`) with a timeout. The table shows test, result,
//!   time and the first failing assertion; it is also written to
//!   `target/conformance/report.md`, with each test's output in `target/conformance/logs/`.
//! - `xtask/conformance.txt` says what each test is expected to do: `pass`, or
//!   `known-fail` with the issue or reason. The run fails when a `pass` test fails, and
//!   when a `known-fail` test passes (so the file is updated and stays true).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{cargo, root, run};

/// The `rdkafka-sys` release whose vendored librdkafka (2.12.1) the tests come from.
const RDKAFKA_SYS: &str = "4.10.0+2.12.1";
/// The broker version the test runner is told, for its per-test version gates.
const KAFKA_VERSION: &str = "3.9.0";
/// How long one test may take before it is killed and counted as failed.
const TEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Debian packages the build needs (package, a file it installs).
const BUILD_PACKAGES: &[(&str, &str)] = &[
    ("build-essential", "/usr/bin/g++"),
    ("python3", "/usr/bin/python3"),
    ("zlib1g-dev", "/usr/include/zlib.h"),
    ("libzstd-dev", "/usr/include/zstd.h"),
];

/// What one test is expected to do, from `xtask/conformance.txt`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    Pass,
    KnownFail(String),
}

struct Options {
    tests: Option<Vec<String>>,
    all: bool,
    scenario: String,
    idempotent: bool,
}

/// One test's outcome.
struct Outcome {
    test: String,
    passed: bool,
    seconds: f64,
    first_failure: String,
}

pub(crate) fn conformance(args: &[String]) -> Result<()> {
    let options = parse(args)?;
    let root = root();
    let expectations = read_expectations(&root.join("xtask/conformance.txt"))?;
    let tests: Vec<String> = match (&options.tests, options.all) {
        (Some(tests), _) => tests.clone(),
        (None, true) => expectations.keys().cloned().collect(),
        (None, false) => core(&expectations),
    };
    let suite = build_suite(&root)?;
    run(cargo(&root).args(["build", "-p", "fjord"])).context("building fjord")?;
    let work = root.join("target/conformance");
    let logs = work.join("logs");
    fs::create_dir_all(&logs)?;
    let broker = DevBroker::start(&root, &work, &options.scenario)?;
    let conf = work.join("test.conf");
    fs::write(&conf, format!("bootstrap.servers={}\n", broker.bootstrap))?;
    let kafka_path = kafka_topics_shim(&root, &work)?;
    let mut outcomes = Vec::new();
    for test in &tests {
        let env = Env { conf: &conf, kafka_path: &kafka_path, bootstrap: &broker.bootstrap };
        let outcome = run_one(&suite, &env, test, &options, &logs)?;
        eprintln!(
            "conformance: {} {} in {:.0} s {}",
            outcome.test,
            if outcome.passed { "passed" } else { "FAILED" },
            outcome.seconds,
            outcome.first_failure
        );
        outcomes.push(outcome);
    }
    drop(broker);
    let (table, surprises) = report(&outcomes, &expectations);
    println!("{table}");
    fs::write(work.join("report.md"), &table)?;
    if !surprises.is_empty() {
        bail!("{} test(s) did not do what xtask/conformance.txt expects:\n{}", surprises.len(), surprises.join("\n"));
    }
    Ok(())
}

fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options { tests: None, all: false, scenario: "default".into(), idempotent: false };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--tests" => {
                let list = args.next().context("--tests needs a list, e.g. 0001,0012")?;
                options.tests = Some(list.split(',').map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()).collect());
            }
            "--all" => options.all = true,
            "--scenario" => {
                let scenario = args.next().context("--scenario needs default or noautocreate")?;
                if scenario != "default" && scenario != "noautocreate" {
                    bail!("--scenario is default or noautocreate, not {scenario}");
                }
                options.scenario = scenario.clone();
            }
            "--idempotent" => options.idempotent = true,
            other => bail!(
                "unknown argument {other}\nusage: cargo xtask conformance [--tests 0001,0011,...] [--all] [--scenario default|noautocreate] [--idempotent]"
            ),
        }
    }
    Ok(options)
}

/// `xtask/conformance.txt`: `NNNN pass [core]` or `NNNN known-fail REASON`, `#` comments.
fn read_expectations(path: &Path) -> Result<BTreeMap<String, (Expected, bool)>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.splitn(3, ' ');
        let (Some(test), Some(verdict)) = (words.next(), words.next()) else {
            bail!("{}:{}: expected `NNNN pass|known-fail ...`", path.display(), n + 1);
        };
        let rest = words.next().unwrap_or_default().trim();
        let entry = match verdict {
            "pass" => (Expected::Pass, rest == "core"),
            "known-fail" if !rest.is_empty() => (Expected::KnownFail(rest.to_owned()), false),
            _ => bail!("{}:{}: `pass [core]` or `known-fail REASON`, not {line:?}", path.display(), n + 1),
        };
        out.insert(test.to_owned(), entry);
    }
    Ok(out)
}

/// The core set: the `pass core` tests (what `cargo xtask test` runs).
fn core(expectations: &BTreeMap<String, (Expected, bool)>) -> Vec<String> {
    expectations.iter().filter(|(_, (_, core))| *core).map(|(t, _)| t.clone()).collect()
}

/// The librdkafka tree in the cargo registry, fetched there when missing.
fn registry_source(root: &Path) -> Result<PathBuf> {
    let find = || -> Option<PathBuf> {
        let home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
        let registries = fs::read_dir(home.join("registry/src")).ok()?;
        registries
            .flatten()
            .map(|r| r.path().join(format!("rdkafka-sys-{RDKAFKA_SYS}/librdkafka")))
            .find(|p| p.join("tests/test.c").exists())
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    // A manifest of our own that names the crate, so that `cargo fetch` puts its
    // source into the registry (nothing is built from it there).
    let fetch = root.join("target/conformance/fetch");
    fs::create_dir_all(fetch.join("src"))?;
    let version = RDKAFKA_SYS.split('+').next().unwrap_or(RDKAFKA_SYS);
    fs::write(
        fetch.join("Cargo.toml"),
        format!(
            "[package]\nname = \"conformance-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[workspace]\n\n[dependencies]\nrdkafka-sys = {{ version = \"={version}\", default-features = false }}\n"
        ),
    )?;
    fs::write(fetch.join("src/lib.rs"), "")?;
    run(cargo(&fetch).args(["fetch", "--manifest-path"]).arg(fetch.join("Cargo.toml")))
        .context("fetching rdkafka-sys into the cargo registry")?;
    find().context("rdkafka-sys was fetched but its librdkafka/tests is not in the registry")
}

/// Builds librdkafka and its test runner in `target/conformance/librdkafka-VERSION`
/// (once); returns the `tests` directory.
fn build_suite(root: &Path) -> Result<PathBuf> {
    let tree = root.join(format!("target/conformance/librdkafka-{RDKAFKA_SYS}"));
    let tests = tree.join("tests");
    if tests.join("test-runner").exists() {
        return Ok(tests);
    }
    let missing: Vec<&str> = BUILD_PACKAGES.iter().filter(|(_, probe)| !Path::new(probe).exists()).map(|(p, _)| *p).collect();
    if !missing.is_empty() {
        eprintln!("xtask: installing {}", missing.join(" "));
        run(Command::new("apt-get").arg("update").arg("-qq"))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))
        .context("apt-get install of the librdkafka build packages failed (run as root)")?;
    }
    let source = registry_source(root)?;
    if tree.exists() {
        fs::remove_dir_all(&tree)?;
    }
    fs::create_dir_all(tree.parent().expect("under target/conformance"))?;
    run(Command::new("cp").arg("-r").arg(&source).arg(&tree)).context("copying librdkafka out of the registry")?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get()).to_string();
    // No TLS, SASL/GSSAPI or OIDC: the tests that need them are known-fail until
    // security lands; lz4 is librdkafka's bundled copy.
    run(Command::new("./configure")
        .args(["--disable-ssl", "--disable-gssapi", "--disable-curl", "--disable-lz4-ext"])
        .current_dir(&tree))
    .context("configuring librdkafka")?;
    run(Command::new("make").args(["-j", &jobs, "libs"]).current_dir(&tree)).context("building librdkafka")?;
    run(Command::new("make").args(["-j", &jobs, "build"]).current_dir(&tests)).context("building librdkafka's test runner")?;
    Ok(tests)
}

/// `fjord dev` on free ports, stopped when dropped.
struct DevBroker {
    child: Child,
    bootstrap: String,
    _data: TempDir,
}

impl DevBroker {
    fn start(root: &Path, work: &Path, scenario: &str) -> Result<Self> {
        let data = TempDir::new(work.join("data"))?;
        let port = || -> Result<u16> { Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
        let (broker, registry, http, grpc, metrics) = (port()?, port()?, port()?, port()?, port()?);
        let log = fs::File::create(work.join("fjord-dev.log"))?;
        let child = Command::new(root.join("target/debug/fjord"))
            .arg("dev")
            .arg("--data-dir")
            .arg(&data.0)
            .env("FJORD_LISTENERS", format!("PLAINTEXT://127.0.0.1:{broker}"))
            .env("FJORD_DEV_REGISTRY", format!("127.0.0.1:{registry}"))
            .env("FJORD_DEV_HTTP", format!("127.0.0.1:{http}"))
            .env("FJORD_DEV_GRPC", format!("127.0.0.1:{grpc}"))
            .env("FJORD_DEV_METRICS", format!("127.0.0.1:{metrics}"))
            // The suite's scenarios: 4 partitions per auto-created topic.
            .env("FJORD_NUM_PARTITIONS", "4")
            .env("FJORD_AUTO_CREATE_TOPICS_ENABLE", if scenario == "noautocreate" { "false" } else { "true" })
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting fjord dev")?;
        let bootstrap = format!("127.0.0.1:{broker}");
        let mut dev = Self { child, bootstrap, _data: data };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(&dev.bootstrap).is_err() {
            if let Some(status) = dev.child.try_wait()? {
                bail!("fjord dev exited ({status}); see target/conformance/fjord-dev.log");
            }
            if Instant::now() > deadline {
                bail!("fjord dev did not listen on {} within 60 s", dev.bootstrap);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(dev)
    }
}

impl Drop for DevBroker {
    fn drop(&mut self) {
        // SIGTERM for a clean stop; the data goes with the temporary directory.
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(path: PathBuf) -> Result<Self> {
        if path.exists() {
            fs::remove_dir_all(&path)?;
        }
        fs::create_dir_all(&path)?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// What every test run is given.
struct Env<'a> {
    conf: &'a Path,
    kafka_path: &'a Path,
    bootstrap: &'a str,
}

/// Some tests create their topics with Kafka's `kafka-topics.sh` (found under
/// `$KAFKA_PATH/bin`). Its `--create` and `--delete` take the same flags as
/// `fjord topics create|delete`, so a small script in `target/conformance/kafka/bin`
/// stands in for it, and `--alter --partitions N` is `fjord topics alter --partitions N`
/// (CreatePartitions).
fn kafka_topics_shim(root: &Path, work: &Path) -> Result<PathBuf> {
    let kafka = work.join("kafka");
    fs::create_dir_all(kafka.join("bin"))?;
    let script = format!(
        r#"#!/usr/bin/env bash
# kafka-topics.sh as librdkafka's tests call it, over `fjord topics` (cargo xtask conformance).
set -euo pipefail
fjord={fjord:?}
bootstrap= action= topic=
rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bootstrap-server) bootstrap=$2; shift 2 ;;
    --create|--delete|--alter) action=${{1#--}}; shift ;;
    --topic) topic=$2; shift 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
case "$action" in
  create) exec "$fjord" topics --bootstrap "$bootstrap" create --topic "$topic" "${{rest[@]}}" ;;
  delete) exec "$fjord" topics --bootstrap "$bootstrap" delete "$topic" ;;
  alter) exec "$fjord" topics --bootstrap "$bootstrap" alter "$topic" "${{rest[@]}}" ;;
  *) echo "kafka-topics.sh shim: --$action ${{rest[*]}} is not supported by fjord topics" >&2; exit 1 ;;
esac
"#,
        fjord = root.join("target/debug/fjord").display().to_string()
    );
    let path = kafka.join("bin/kafka-topics.sh");
    fs::write(&path, script)?;
    run(Command::new("chmod").arg("+x").arg(&path))?;
    Ok(kafka)
}

fn run_one(suite: &Path, env: &Env<'_>, test: &str, options: &Options, logs: &Path) -> Result<Outcome> {
    let log_path = logs.join(format!("{test}.log"));
    let log = fs::File::create(&log_path)?;
    let mut cmd = Command::new(suite.join("test-runner"));
    // -L: the tests that talk to a broker only; -E: no socket-emulation tests.
    cmd.args(["-L", "-E", "-V", KAFKA_VERSION, "-s", &options.scenario]);
    if options.idempotent {
        cmd.arg("-P");
    }
    cmd.current_dir(suite)
        .env("TESTS", test)
        // The runner links librdkafka's shared libraries from the tree it was built in.
        .env("LD_LIBRARY_PATH", format!("{0}/../src:{0}/../src-cpp", suite.display()))
        .env("RDKAFKA_TEST_CONF", env.conf)
        .env("KAFKA_PATH", env.kafka_path)
        .env("BROKERS", env.bootstrap)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let started = Instant::now();
    let mut child = cmd.spawn().context("starting test-runner")?;
    let passed = loop {
        if let Some(status) = child.try_wait()? {
            break status.success();
        }
        if started.elapsed() > TEST_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut output = String::new();
    fs::File::open(&log_path)?.read_to_string(&mut output)?;
    let first_failure = if passed {
        String::new()
    } else if seconds >= TEST_TIMEOUT.as_secs_f64() {
        format!("timed out after {} s", TEST_TIMEOUT.as_secs())
    } else {
        first_failure(&output)
    };
    Ok(Outcome { test: test.to_owned(), passed, seconds, first_failure })
}

/// The first `### Test "..." failed at FILE:LINE` and the assertion message after it.
fn first_failure(output: &str) -> String {
    let mut lines = output.lines();
    while let Some(line) = lines.next() {
        if let Some(at) = line.find("failed at ") {
            let place = line[at + "failed at ".len()..].split(" at ").next().unwrap_or_default();
            let message = lines.next().unwrap_or_default();
            return format!("{place}: {}", strip_colors(message).trim());
        }
    }
    "failed without an assertion message (see the log)".into()
}

fn strip_colors(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The table, and the tests that did not do what the expectations file says.
fn report(outcomes: &[Outcome], expectations: &BTreeMap<String, (Expected, bool)>) -> (String, Vec<String>) {
    let mut table = String::from("| test | result | expected | time | first failing assertion |\n|---|---|---|---|---|\n");
    let mut surprises = Vec::new();
    for o in outcomes {
        let expected = expectations.get(&o.test).map(|(e, _)| e.clone());
        let expected_text = match &expected {
            Some(Expected::Pass) => "pass".to_owned(),
            Some(Expected::KnownFail(reason)) => format!("known-fail: {reason}"),
            None => "not listed".to_owned(),
        };
        match (&expected, o.passed) {
            (Some(Expected::Pass), false) => surprises.push(format!("{} failed: {}", o.test, o.first_failure)),
            (Some(Expected::KnownFail(reason)), true) => {
                surprises.push(format!("{} passes now (known-fail: {reason}): mark it pass", o.test))
            }
            (None, _) => surprises.push(format!("{} is not in xtask/conformance.txt", o.test)),
            _ => {}
        }
        table.push_str(&format!(
            "| {} | {} | {} | {:.0} s | {} |\n",
            o.test,
            if o.passed { "pass" } else { "FAIL" },
            expected_text,
            o.seconds,
            o.first_failure.replace('|', "\\|")
        ));
    }
    (table, surprises)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_the_place_and_the_assertion() {
        let output = "[0011 / 1.0s] producing\n\u{1b}[31m### Test \"0011_produce_batch (record_fail)\" failed at 0011-produce_batch.c:120:test_single_partition() at Tue Dec  1 12:00:00 2026: ###\nrecord_fail: Expected 10 failed, got 100\n\u{1b}[0m### second ###\nlater\n";
        assert_eq!(
            first_failure(output),
            "0011-produce_batch.c:120:test_single_partition(): record_fail: Expected 10 failed, got 100"
        );
        assert_eq!(first_failure("nothing"), "failed without an assertion message (see the log)");
    }

    #[test]
    fn the_expectations_file_is_read_strictly() {
        let dir = std::env::temp_dir().join(format!("xtask-expect-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("e.txt");
        fs::write(&file, "# comment\n0001 pass core\n0002 pass\n0081 known-fail #22: CreatePartitions\n").unwrap();
        let read = read_expectations(&file).unwrap();
        assert_eq!(read["0001"], (Expected::Pass, true));
        assert_eq!(read["0002"], (Expected::Pass, false));
        assert_eq!(read["0081"], (Expected::KnownFail("#22: CreatePartitions".into()), false));
        assert_eq!(core(&read), vec!["0001".to_string()]);
        fs::write(&file, "0003 known-fail\n").unwrap();
        assert!(read_expectations(&file).is_err(), "a known-fail needs its reason");
        fs::write(&file, "0003 flaky\n").unwrap();
        assert!(read_expectations(&file).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
