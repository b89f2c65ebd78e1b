//! `cargo xtask conformance`: librdkafka's own integration tests, unchanged, against
//! `fjord dev`, or with `--cluster` against three `fjord broker`s on ZooKeeper (#27).
//!
//! - The tests come from the `rdkafka-sys` crate's vendored librdkafka (pinned below),
//!   fetched into the cargo registry with `cargo fetch` when missing. The tree is copied
//!   into `target/conformance/` and built there (`./configure`, `make libs`, the test
//!   runner); the registry copy is never written to.
//! - A `fjord dev` on free ports serves each run, with `num.partitions=4` as the suite's
//!   own scenarios set (and `auto.create.topics.enable=false` for `noautocreate`). With
//!   `--cluster`, a ZooKeeper and three `fjord broker` processes on free ports instead,
//!   with `default.replication.factor=3` and `min.insync.replicas=1`: the suite creates
//!   its own topics with replication factor 1, and acks=all on those needs a minimum of 1
//!   (Kafka refuses it just the same; the suite's own cluster scenario sets 1 too).
//! - Each test runs alone (`TESTS=NNNN`) with a timeout. The table shows test, result
//!   (`pass`, `FAIL`, or `skip` when the runner itself skipped every variant, e.g. one
//!   for the other scenario), time and the first failing assertion. Each run has its own
//!   directory, `target/conformance/runs/{dev|cluster}-SCENARIO[-sasl_ssl][-idempotent][-selected]/`
//!   (`-selected` for a `--tests` run), with the
//!   table in `report.md`, each test's output in `logs/` and the brokers' logs, so runs
//!   of different modes can go on side by side.
//! - At a run's first failure, [`diagnose`] looks at the run's servers and the machine;
//!   a server that exited ends the run (the tests left could only fail for that). What
//!   it found goes into the run's error, which `cargo xtask test` prints last.
//! - `xtask/conformance.txt` says what each test is expected to do: `pass`, or
//!   `known-fail` with the issue or reason. The run fails when a `pass` test fails, and
//!   when a `known-fail` test passes (so the file is updated and stays true).
//! - `--security sasl_ssl` runs the tests that need the suite's security scenario (TLS
//!   and SASL: 0097, 0135, 0142; marked `sasl_ssl` in the file) over a SASL_SSL
//!   listener that each broker has beside its PLAINTEXT one, as a SCRAM user created
//!   before the brokers start, with a CA and certificates made for the run
//!   ([`TlsFixtures`]). `--all` runs them too, in a second run after the plaintext one.

mod brokers;
mod expectations;
mod security;
mod suite;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use self::brokers::{Brokers, ClusterBrokers, DevBroker};
use self::expectations::{core, read_expectations, Expectation, Expected, Security};
use self::security::TlsFixtures;
use self::suite::{build_suite, kafka_shims};
use crate::{cargo, root, run};

/// The `rdkafka-sys` release whose vendored librdkafka (2.12.1) the tests come from.
const RDKAFKA_SYS: &str = "4.10.0+2.12.1";
/// The one test of the suite that uses librdkafka's file offset store.
const FILE_OFFSET_STORE_TEST: &str = "0014";
/// The broker version the test runner is told, for its per-test version gates.
const KAFKA_VERSION: &str = "3.9.0";
/// How long one test may take before it is killed and counted as failed.
const TEST_TIMEOUT: Duration = Duration::from_secs(300);

struct Options {
    tests: Option<Vec<String>>,
    all: bool,
    scenario: String,
    idempotent: bool,
    cluster: bool,
    /// `--security`; without it, `--all` runs both (the plaintext run first).
    security: Option<Security>,
}

impl Options {
    fn security(&self) -> Security {
        self.security.unwrap_or(Security::Plaintext)
    }

    fn describe(&self) -> String {
        format!(
            "{}, scenario {}{}{}",
            if self.cluster { "3 fjord brokers on ZooKeeper" } else { "fjord dev" },
            self.scenario,
            if self.security() == Security::SaslSsl { ", over SASL_SSL (SCRAM-SHA-256)" } else { "" },
            if self.idempotent { ", idempotent producer (-P)" } else { "" }
        )
    }

    /// The run's directory name under `target/conformance/runs`; a `--tests` run has
    /// its own, so it can go on beside a full run of the same mode.
    fn run_name(&self) -> String {
        format!(
            "{}-{}{}{}{}",
            if self.cluster { "cluster" } else { "dev" },
            self.scenario,
            if self.security() == Security::SaslSsl { "-sasl_ssl" } else { "" },
            if self.idempotent { "-idempotent" } else { "" },
            if self.tests.is_some() { "-selected" } else { "" }
        )
    }

    /// The runs this invocation makes: one, or with `--all` and no `--security` the
    /// plaintext run and then the security scenario's (whose tests are all the default
    /// scenario's: under `noautocreate` the runner would skip every one).
    fn runs(self) -> Vec<Options> {
        if !(self.all && self.security.is_none() && self.scenario == "default") {
            return vec![self];
        }
        let with = |security| Options { security: Some(security), scenario: self.scenario.clone(), tests: None, ..self };
        vec![with(Security::Plaintext), with(Security::SaslSsl)]
    }
}

/// What the runner made of one test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    Fail,
    /// The runner skipped every variant of the test (another scenario's test, or one
    /// the runner leaves out by its own flags): it says nothing either way.
    Skip,
}

/// One test's outcome.
struct Outcome {
    test: String,
    result: Verdict,
    seconds: f64,
    first_failure: String,
}

pub(crate) fn conformance(args: &[String]) -> Result<()> {
    let options = parse(args)?;
    let root = root();
    let expectations = read_expectations(&root.join("xtask/conformance.txt"))?;
    let suite = build_suite(&root)?;
    run(cargo(&root).args(["build", "-p", "fjord"])).context("building fjord")?;
    let mut surprises = Vec::new();
    for options in options.runs() {
        surprises.extend(run_tests(&root, &suite, &expectations, &options)?);
    }
    if !surprises.is_empty() {
        bail!("{} test(s) did not do what xtask/conformance.txt expects:\n{}", surprises.len(), surprises.join("\n"));
    }
    Ok(())
}

/// `cargo xtask test`'s part: the core set on `fjord dev` and on three brokers on
/// ZooKeeper, side by side. Each run has its own brokers, ports and directory, and
/// spends most of its time waiting on its clients' timeouts: one after the other they
/// took ~6 minutes of CI. The `fjord` binary is the one the tests were built with
/// (`cargo test --workspace --no-run`, nothing to do after them): `cargo build -p
/// fjord` would build a dozen crates again (~1 minute), their features then being
/// fjord's alone, not the whole workspace's with its dev-dependencies.
pub(crate) fn core_sets() -> Result<()> {
    let root = root();
    let expectations = read_expectations(&root.join("xtask/conformance.txt"))?;
    let suite = build_suite(&root)?;
    run(cargo(&root).args(["test", "--workspace", "--no-run"])).context("building fjord")?;
    let runs = [parse(&[])?, parse(&["--cluster".to_owned()])?];
    let results: Vec<(String, Result<Vec<String>>)> = std::thread::scope(|scope| {
        let started: Vec<_> = runs
            .iter()
            .map(|options| (options.describe(), scope.spawn(|| run_tests(&root, &suite, &expectations, options))))
            .collect();
        started
            .into_iter()
            .map(|(name, run)| (name, run.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the run panicked")))))
            .collect()
    });
    let mut failures = Vec::new();
    for (name, result) in results {
        match result {
            Ok(surprises) => failures.extend(surprises.into_iter().map(|s| format!("{name}: {s}"))),
            Err(e) => failures.push(format!("{name}: {e:#}")),
        }
    }
    if !failures.is_empty() {
        bail!(
            "librdkafka's integration tests (core set) did not do what xtask/conformance.txt expects:\n{}",
            failures.join("\n")
        );
    }
    Ok(())
}

/// The tests one run takes: those named, or all of the run's security, or its core set
/// (the security scenario has no core set: all of its tests).
fn selected(expectations: &BTreeMap<String, Expectation>, options: &Options) -> Vec<String> {
    let security = options.security();
    match &options.tests {
        Some(tests) => tests.clone(),
        None if options.all || security != Security::Plaintext => {
            expectations.iter().filter(|(_, e)| e.security == security).map(|(t, _)| t.clone()).collect()
        }
        None => core(expectations, options.cluster),
    }
}

/// Makes `dir` an empty directory, removing what an earlier run of this checkout left.
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    fs::create_dir_all(dir)?;
    Ok(())
}

/// One run: brokers for it, its tests, the table; the tests that surprised.
fn run_tests(root: &Path, suite: &Path, expectations: &BTreeMap<String, Expectation>, options: &Options) -> Result<Vec<String>> {
    let tests = selected(expectations, options);
    let work = root.join("target/conformance/runs").join(options.run_name());
    let logs = work.join("logs");
    fresh_dir(&logs)?;
    let security = match options.security() {
        Security::Plaintext => None,
        Security::SaslSsl => Some(TlsFixtures::make(&work.join("tls"))?),
    };
    let mut brokers: Box<dyn Brokers> = if options.cluster {
        Box::new(ClusterBrokers::start(root, &work, &options.scenario, security.as_ref())?)
    } else {
        Box::new(DevBroker::start(root, &work, &options.scenario, security.as_ref())?)
    };
    let bootstrap = brokers.bootstrap().to_owned();
    let conf = work.join("test.conf");
    let mut test_env = Vec::new();
    let client_conf = match &security {
        None => format!("bootstrap.servers={bootstrap}\n"),
        Some(tls) => {
            test_env = tls.test_env();
            tls.client_conf(brokers.sasl_ssl_bootstrap())
        }
    };
    fs::write(&conf, &client_conf)?;
    // librdkafka's file offset store (only FILE_OFFSET_STORE_TEST runs with
    // `offset.store.method=file`) writes `<topic>-<partition>.offset` into its working
    // directory, the suite's, shared by every run of this checkout: a later run whose
    // random topic name repeats an earlier one then starts from the old file's offset. So
    // that test gets an empty directory of its own per run. Only that test: with
    // `topic.offset.store.path` set, 0061 crashes (SIGSEGV) right after it has produced.
    let offsets = work.join("offsets");
    fresh_dir(&offsets)?;
    let file_store_conf = work.join("test-file-offset-store.conf");
    fs::write(&file_store_conf, format!("{client_conf}topic.offset.store.path={}\n", offsets.display()))?;
    let kafka_path = kafka_shims(root, &work)?;
    let mut outcomes = Vec::new();
    let mut diagnosis = None;
    for test in &tests {
        let conf = if test == FILE_OFFSET_STORE_TEST { &file_store_conf } else { &conf };
        let env = Env { conf, kafka_path: &kafka_path, bootstrap: &bootstrap, extra: &test_env };
        let timeout = expectations.get(test).map_or(TEST_TIMEOUT, |e| e.timeout);
        let outcome = run_one(suite, &env, test, timeout, options, &logs)?;
        eprintln!(
            "conformance ({}): {} {} in {:.0} s {}",
            options.run_name(),
            outcome.test,
            match outcome.result {
                Verdict::Pass => "passed",
                Verdict::Fail => "FAILED",
                Verdict::Skip => "skipped",
            },
            outcome.seconds,
            outcome.first_failure
        );
        let failed = outcome.result == Verdict::Fail;
        outcomes.push(outcome);
        // CI keeps only the output: at the first failure, what the run's servers and the
        // machine were doing goes into the run's error, printed last. Once a server has
        // exited, the tests left could only fail for that, so the run stops there.
        if failed && diagnosis.is_none() {
            let found = diagnose(&mut *brokers, &work);
            let stop = found.server_exited;
            diagnosis = Some(found.text);
            if stop {
                break;
            }
        }
    }
    let not_run = tests.len() - outcomes.len();
    drop(brokers);
    let (mut table, mut surprises) = report(&outcomes, expectations, options.cluster);
    if not_run > 0 {
        surprises.push(format!("{not_run} tests not run: a server of the run had exited"));
    }
    surprises.extend(diagnosis.map(|d| format!("at the first failure, {d}")));
    table.insert_str(0, &format!("librdkafka {RDKAFKA_SYS} tests against {}\n\n", options.describe()));
    println!("{table}");
    fs::write(work.join("report.md"), &table)?;
    eprintln!("conformance: the table is in {}", work.join("report.md").display());
    Ok(surprises)
}

fn parse(args: &[String]) -> Result<Options> {
    let mut options =
        Options { tests: None, all: false, scenario: "default".into(), idempotent: false, cluster: false, security: None };
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
            "--cluster" => options.cluster = true,
            "--security" => {
                let name = args.next().context("--security needs plaintext or sasl_ssl")?;
                options.security =
                    Some(Security::parse(name).with_context(|| format!("--security is plaintext or sasl_ssl, not {name}"))?);
            }
            other => bail!(
                "unknown argument {other}\nusage: cargo xtask conformance [--tests 0001,0011,...] [--all] [--scenario default|noautocreate] [--security plaintext|sasl_ssl] [--idempotent] [--cluster]"
            ),
        }
    }
    Ok(options)
}

/// What every test run is given.
struct Env<'a> {
    conf: &'a Path,
    kafka_path: &'a Path,
    bootstrap: &'a str,
    /// The security scenario's `SSL_*` variables ([`TlsFixtures::test_env`]).
    extra: &'a [(String, String)],
}

fn run_one(suite: &Path, env: &Env<'_>, test: &str, timeout: Duration, options: &Options, logs: &Path) -> Result<Outcome> {
    let log_path = logs.join(format!("{test}.log"));
    let log = fs::File::create(&log_path)?;
    let mut cmd = Command::new(suite.join("test-runner"));
    // -L: the tests that talk to a broker only. The socket-emulation tests run too: they
    // delay or cut the client's own socket to a real broker.
    cmd.args(["-L", "-V", KAFKA_VERSION, "-s", &options.scenario]);
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
        .envs(env.extra.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let started = Instant::now();
    let mut child = cmd.spawn().context("starting test-runner")?;
    let passed = loop {
        if let Some(status) = child.try_wait()? {
            break status.success();
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut output = Vec::new();
    fs::File::open(&log_path)?.read_to_end(&mut output)?;
    let output = String::from_utf8_lossy(&output);
    let skipped = if passed { all_skipped(&output, test) } else { None };
    let (result, first_failure) = if let Some(reasons) = skipped {
        (Verdict::Skip, reasons)
    } else if passed {
        (Verdict::Pass, String::new())
    } else if seconds >= timeout.as_secs_f64() {
        (Verdict::Fail, format!("timed out after {} s", timeout.as_secs()))
    } else {
        (Verdict::Fail, first_failure(&output))
    };
    Ok(Outcome { test: test.to_owned(), result, seconds, first_failure })
}

/// What [`diagnose`] found.
struct Diagnosis {
    text: String,
    server_exited: bool,
}

/// The run's servers (which exited and how, the end of their logs) and the machine's
/// disk, memory, sockets and out-of-memory kills, as lines for the output.
fn diagnose(brokers: &mut dyn Brokers, work: &Path) -> Diagnosis {
    let mut text = String::from("the run's servers and the machine:\n");
    let mut server_exited = false;
    for mut server in brokers.servers() {
        let log = fs::read(&server.log).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        let lines: Vec<String> = log.lines().map(strip_colors).collect();
        let (head, shown) = match server.exited() {
            Some(status) => {
                server_exited = true;
                (format!("{} EXITED ({status}); its log ends", server.what), last(&lines, 20, |_| true))
            }
            None => (
                format!("{} runs; its last warnings and errors", server.what),
                last(&lines, 8, |l| ["WARN", "ERROR", "panicked", "Exception"].iter().any(|w| l.contains(w))),
            ),
        };
        text.push_str(&format!("  {head} ({}):\n", server.log.display()));
        for line in shown {
            text.push_str(&format!("    {line}\n"));
        }
    }
    let work = work.display();
    let commands = [
        format!("df -h '{work}'"),
        "free -m | head -n 2".into(),
        "ss -s | head -n 2".into(),
        "dmesg 2>/dev/null | grep -iE 'out of memory|killed process' | tail -n 3".into(),
    ];
    for command in commands {
        let output = Command::new("sh").args(["-c", &command]).output();
        let shown = output.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_else(|e| format!("{e}"));
        text.push_str(&format!("  $ {command}\n"));
        for line in shown.lines().filter(|l| !l.trim().is_empty()) {
            text.push_str(&format!("    {line}\n"));
        }
    }
    Diagnosis { text, server_exited }
}

/// The last `n` of `lines` that `keep` keeps.
fn last(lines: &[String], n: usize, keep: impl Fn(&str) -> bool) -> Vec<&str> {
    let mut kept: Vec<&str> = lines.iter().rev().map(String::as_str).filter(|l| keep(l)).take(n).collect();
    kept.reverse();
    kept
}

/// When the runner's summary lists test `test`'s variants and every one of them as
/// SKIPPED (`| 0053_stats | SKIPPED | 0.000s | RapidJSON >=1.1.0 not available`): the
/// reasons it gives, `;`-joined.
fn all_skipped(output: &str, test: &str) -> Option<String> {
    let prefix = format!("{test}_");
    let mut reasons: Vec<String> = Vec::new();
    let mut any = false;
    for line in output.lines().map(strip_colors) {
        let mut cells = line.split('|').map(str::trim).skip(1);
        let (Some(name), Some(state)) = (cells.next(), cells.next()) else { continue };
        if !name.starts_with(&prefix) {
            continue;
        }
        if state != "SKIPPED" {
            return None;
        }
        any = true;
        let reason = cells.nth(1).unwrap_or_default();
        let reason = if reason.is_empty() { "another scenario's test" } else { reason };
        if !reasons.iter().any(|r| r == reason) {
            reasons.push(reason.to_owned());
        }
    }
    any.then(|| format!("skipped: {}", reasons.join("; ")))
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
    let last_line = output.lines().map(strip_colors).rfind(|l| !l.trim().is_empty()).unwrap_or_default();
    format!("failed without an assertion message; its output ends: {}", last_line.trim())
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
fn report(outcomes: &[Outcome], expectations: &BTreeMap<String, Expectation>, cluster: bool) -> (String, Vec<String>) {
    let mut table = String::from("| test | result | expected | time | first failing assertion |\n|---|---|---|---|---|\n");
    let mut surprises = Vec::new();
    for o in outcomes {
        let expected = expectations.get(&o.test).map(|e| e.expected.in_mode(cluster));
        let expected_text = match &expected {
            Some(Expected::Pass) => "pass".to_owned(),
            Some(Expected::KnownFail(reason)) => format!("known-fail: {reason}"),
            Some(Expected::Skip(reason)) => format!("skip: {reason}"),
            Some(Expected::ClusterOnly(reason)) => format!("cluster-only: {reason}"),
            None => "not listed".to_owned(),
        };
        match (&expected, o.result) {
            (Some(Expected::Pass), Verdict::Fail) => surprises.push(format!("{} failed: {}", o.test, o.first_failure)),
            (Some(Expected::KnownFail(reason)), Verdict::Pass) => {
                surprises.push(format!("{} passes now (known-fail: {reason}): mark it pass", o.test))
            }
            (Some(Expected::Skip(reason)), Verdict::Pass | Verdict::Fail) => {
                surprises.push(format!("{} ran (expected skip: {reason}): {}", o.test, o.first_failure))
            }
            (None, _) => surprises.push(format!("{} is not in xtask/conformance.txt", o.test)),
            _ => {}
        }
        table.push_str(&format!(
            "| {} | {} | {} | {:.0} s | {} |\n",
            o.test,
            match o.result {
                Verdict::Pass => "pass",
                Verdict::Fail => "FAIL",
                Verdict::Skip => "skip",
            },
            expected_text,
            o.seconds,
            o.first_failure.replace('|', "\\|")
        ));
    }
    let count = |v: Verdict| outcomes.iter().filter(|o| o.result == v).count();
    let known = outcomes
        .iter()
        .filter(|o| {
            o.result == Verdict::Fail
                && expectations.get(&o.test).is_some_and(|e| matches!(e.expected.in_mode(cluster), Expected::KnownFail(_)))
        })
        .count();
    table.push_str(&format!(
        "\n{} tests: {} passed, {} failed ({known} of them known-fail), {} skipped by the runner\n",
        outcomes.len(),
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::Skip)
    ));
    (table, surprises)
}

#[cfg(test)]
mod tests {
    use super::expectations::Core;
    use super::*;

    #[test]
    fn the_first_failure_is_the_place_and_the_assertion() {
        let output = "[0011 / 1.0s] producing\n\u{1b}[31m### Test \"0011_produce_batch (record_fail)\" failed at 0011-produce_batch.c:120:test_single_partition() at Tue Dec  1 12:00:00 2026: ###\nrecord_fail: Expected 10 failed, got 100\n\u{1b}[0m### second ###\nlater\n";
        assert_eq!(
            first_failure(output),
            "0011-produce_batch.c:120:test_single_partition(): record_fail: Expected 10 failed, got 100"
        );
        assert_eq!(first_failure("one\ntwo\n\n"), "failed without an assertion message; its output ends: two");
    }

    #[test]
    fn all_runs_the_security_scenario_after_the_plaintext_run() {
        let options = |args: &[&str]| parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>()).unwrap();
        let names = |args: &[&str]| options(args).runs().iter().map(Options::run_name).collect::<Vec<_>>();
        assert_eq!(names(&["--all"]), ["dev-default", "dev-default-sasl_ssl"]);
        assert_eq!(names(&["--all", "--cluster"]), ["cluster-default", "cluster-default-sasl_ssl"]);
        assert_eq!(names(&["--all", "--security", "plaintext"]), ["dev-default"]);
        assert_eq!(names(&["--all", "--scenario", "noautocreate"]), ["dev-noautocreate"], "the scenario's tests are default's");
        assert_eq!(names(&["--security", "sasl_ssl", "--tests", "0097"]), ["dev-default-sasl_ssl-selected"]);
        assert_eq!(names(&[]), ["dev-default"], "the core set is plaintext only");
        assert!(parse(&["--security".to_string(), "ssl".to_string()]).is_err());

        let line = |security| Expectation { expected: Expected::Pass, core: Core::No, timeout: TEST_TIMEOUT, security };
        let mut expectations = BTreeMap::new();
        expectations.insert("0001".to_string(), Expectation { core: Core::Both, ..line(Security::Plaintext) });
        expectations.insert("0002".to_string(), line(Security::Plaintext));
        expectations.insert("0135".to_string(), line(Security::SaslSsl));
        let selected = |args: &[&str]| options(args).runs().iter().map(|o| selected(&expectations, o)).collect::<Vec<_>>();
        assert_eq!(selected(&["--all"]), [vec!["0001", "0002"], vec!["0135"]]);
        assert_eq!(selected(&[]), [vec!["0001"]]);
        assert_eq!(selected(&["--security", "sasl_ssl"]), [vec!["0135"]]);
    }

    #[test]
    fn a_cluster_only_failure_on_one_broker_is_known_and_a_pass_failing_is_a_surprise() {
        let line = |expected| Expectation { expected, core: Core::No, timeout: TEST_TIMEOUT, security: Security::Plaintext };
        let mut expectations = BTreeMap::new();
        expectations.insert("0001".to_string(), line(Expected::Pass));
        expectations.insert("0103".to_string(), line(Expected::ClusterOnly("replication factor 3".into())));
        let failed = |test: &str| Outcome { test: test.into(), result: Verdict::Fail, seconds: 1.0, first_failure: "x".into() };
        let (table, surprises) = report(&[failed("0001"), failed("0103")], &expectations, false);
        assert!(table.ends_with("2 tests: 0 passed, 2 failed (1 of them known-fail), 0 skipped by the runner\n"), "{table}");
        assert_eq!(surprises, ["0001 failed: x"]);
        let (_, surprises) = report(&[failed("0103")], &expectations, true);
        assert_eq!(surprises, ["0103 failed: x"], "on three brokers a cluster-only test must pass");
    }

    #[test]
    fn a_test_is_skipped_only_when_every_variant_is() {
        let summary = |a: &str, b: &str| {
            format!("|\u{1b}[36m 0045_subscribe_update                  |    {a} |   1.000s \u{1b}[0m|\u{1b}[36m RapidJSON missing\u{1b}[0m\n| 0045_resubscribe_with_regex    | {b} | 2.000s |\n| 0046_other | PASSED | 1s |\n")
        };
        assert_eq!(
            all_skipped(&summary("SKIPPED", "SKIPPED"), "0045").as_deref(),
            Some("skipped: RapidJSON missing; another scenario's test")
        );
        assert_eq!(all_skipped(&summary("SKIPPED", "PASSED"), "0045"), None);
        assert_eq!(all_skipped(&summary("PASSED", "PASSED"), "0045"), None);
        assert_eq!(all_skipped("no summary at all", "0045"), None, "no summary is not a skip");
    }
}
