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
//! - `xtask/conformance.txt` says what each test is expected to do: `pass`, or
//!   `known-fail` with the issue or reason. The run fails when a `pass` test fails, and
//!   when a `known-fail` test passes (so the file is updated and stays true).
//! - `--security sasl_ssl` runs the tests that need the suite's security scenario (TLS
//!   and SASL: 0097, 0135, 0142; marked `sasl_ssl` in the file) over a SASL_SSL
//!   listener that each broker has beside its PLAINTEXT one, as a SCRAM user created
//!   before the brokers start, with a CA and certificates made for the run
//!   ([`TlsFixtures`]). `--all` runs them too, in a second run after the plaintext one.

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
/// The brokers' `log.min.segment.bytes`: the suite is written for Kafka 3.9, whose
/// `segment.bytes` may go down to 14 bytes, and 0077 and 0129 create topics with
/// 10000 and 20000 bytes, under Fjord's default floor of 1 MiB.
const MIN_SEGMENT_BYTES: &str = "10000";
/// How long one test may take before it is killed and counted as failed.
const TEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Debian packages the build needs (package, a file it installs).
const BUILD_PACKAGES: &[(&str, &str)] = &[
    ("build-essential", "/usr/bin/g++"),
    ("python3", "/usr/bin/python3"),
    ("zlib1g-dev", "/usr/include/zlib.h"),
    ("libzstd-dev", "/usr/include/zstd.h"),
    // The suite checks statistics JSON with RapidJSON; without it 0053, 0098, 0101 and
    // 0110 skip themselves.
    ("rapidjson-dev", "/usr/include/rapidjson/schema.h"),
    // TLS for the `sasl_ssl` scenario's tests (0097, 0135, 0142).
    ("libssl-dev", "/usr/include/openssl/ssl.h"),
];
/// `./configure`'s flags. With OpenSSL (SSL listeners, SCRAM's hashes), without
/// SASL/GSSAPI (Kerberos) or OIDC, which Fjord does not offer; lz4 is librdkafka's
/// bundled copy.
const CONFIGURE_FLAGS: &[&str] = &["--disable-gssapi", "--disable-curl", "--disable-lz4-ext"];
/// Written into a finished build; a tree built from other packages or flags (one from
/// before RapidJSON or OpenSSL was added) is built again.
const BUILD_KEY: &str = "configure --disable-gssapi --disable-curl --disable-lz4-ext; with rapidjson-dev libssl-dev\n";

/// What one test is expected to do, from `xtask/conformance.txt`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    Pass,
    KnownFail(String),
    /// The runner itself skips it against any broker here (it needs what the runner
    /// was built without, or a mode Fjord does not serve), with the reason.
    Skip(String),
    /// Needs three brokers (it creates topics with replication factor 3, as Kafka
    /// refuses on one broker too): known-fail on `fjord dev` for the reason, pass with
    /// `--cluster`.
    ClusterOnly(String),
}

impl Expected {
    /// What is expected in this mode: a [`Expected::ClusterOnly`] test is a pass on
    /// three brokers and a known-fail on one.
    fn in_mode(&self, cluster: bool) -> Expected {
        match self {
            Expected::ClusterOnly(_) if cluster => Expected::Pass,
            Expected::ClusterOnly(reason) => Expected::KnownFail(format!("needs three brokers: {reason}")),
            other => other.clone(),
        }
    }
}

/// How the tests' clients reach the brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Security {
    /// PLAINTEXT, no authentication: every test but the security scenario's.
    Plaintext,
    /// The suite's security scenario: a SASL_SSL listener (TLS, SCRAM-SHA-256).
    SaslSsl,
}

impl Security {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "plaintext" => Some(Self::Plaintext),
            "sasl_ssl" => Some(Self::SaslSsl),
            _ => None,
        }
    }
}

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

/// One run: brokers for it, its tests, the table; the tests that surprised.
fn run_tests(root: &Path, suite: &Path, expectations: &BTreeMap<String, Expectation>, options: &Options) -> Result<Vec<String>> {
    let tests = selected(expectations, options);
    let work = root.join("target/conformance/runs").join(options.run_name());
    let logs = work.join("logs");
    if logs.exists() {
        fs::remove_dir_all(&logs)?;
    }
    fs::create_dir_all(&logs)?;
    let security = match options.security() {
        Security::Plaintext => None,
        Security::SaslSsl => Some(TlsFixtures::make(&work.join("tls"))?),
    };
    let brokers: Box<dyn Brokers> = if options.cluster {
        Box::new(ClusterBrokers::start(root, &work, &options.scenario, security.as_ref())?)
    } else {
        Box::new(DevBroker::start(root, &work, &options.scenario, security.as_ref())?)
    };
    let bootstrap = brokers.bootstrap().to_owned();
    let conf = work.join("test.conf");
    let mut test_env = Vec::new();
    match &security {
        None => fs::write(&conf, format!("bootstrap.servers={bootstrap}\n"))?,
        Some(tls) => {
            fs::write(&conf, tls.client_conf(brokers.sasl_ssl_bootstrap()))?;
            test_env = tls.test_env();
        }
    }
    let kafka_path = kafka_shims(root, &work)?;
    let mut outcomes = Vec::new();
    for test in &tests {
        let env = Env { conf: &conf, kafka_path: &kafka_path, bootstrap: &bootstrap, extra: &test_env };
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
        outcomes.push(outcome);
    }
    drop(brokers);
    let (mut table, surprises) = report(&outcomes, expectations, options.cluster);
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

/// One line of `xtask/conformance.txt`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expectation {
    expected: Expected,
    /// In the core set, and in which modes.
    core: Core,
    /// How long the test may take: [`TEST_TIMEOUT`] unless the line says `timeout=SECONDS`
    /// (a test the suite itself runs for many minutes).
    timeout: Duration,
    /// The run it belongs to: [`Security::SaslSsl`] when the line says `sasl_ssl` after
    /// the test (the runner skips it without the security scenario).
    security: Security,
}

/// Which core sets a test is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Core {
    No,
    /// `core`: on one broker and on three.
    Both,
    /// `core-dev`: on `fjord dev` only. A test of single-broker behaviour that takes long
    /// (0030, 50 s) is run once, so CI's three-broker pass stays on what three brokers change.
    Dev,
}

/// `xtask/conformance.txt`: `NNNN [sasl_ssl] pass [core|core-dev] [timeout=SECONDS]`,
/// `NNNN [sasl_ssl] known-fail REASON`, `... cluster-only REASON` or `... skip REASON`,
/// `#` comments.
fn read_expectations(path: &Path) -> Result<BTreeMap<String, Expectation>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let wrong = || {
            anyhow::anyhow!(
                "{}:{}: `NNNN [sasl_ssl] pass [core|core-dev] [timeout=SECONDS]`, `known-fail REASON`, `cluster-only REASON` or `skip REASON`, not {line:?}",
                path.display(),
                n + 1
            )
        };
        let (test, rest) = line.split_once(' ').ok_or_else(wrong)?;
        let (security, rest) = match rest.trim_start().split_once(' ') {
            Some(("sasl_ssl", rest)) => (Security::SaslSsl, rest.trim_start()),
            _ if rest.trim() == "sasl_ssl" => return Err(wrong()),
            _ => (Security::Plaintext, rest.trim_start()),
        };
        let (verdict, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        let rest = rest.trim();
        let with = |expected| Expectation { expected, core: Core::No, timeout: TEST_TIMEOUT, security };
        let entry = match verdict {
            "pass" => {
                let mut entry = with(Expected::Pass);
                for word in rest.split_whitespace() {
                    match word.strip_prefix("timeout=") {
                        None if word == "core" => entry.core = Core::Both,
                        None if word == "core-dev" => entry.core = Core::Dev,
                        Some(secs) => entry.timeout = Duration::from_secs(secs.parse().map_err(|_| wrong())?),
                        None => return Err(wrong()),
                    }
                }
                if entry.core != Core::No && security != Security::Plaintext {
                    // The core set is one plaintext run (CI's).
                    return Err(wrong());
                }
                entry
            }
            "known-fail" if !rest.is_empty() => with(Expected::KnownFail(rest.to_owned())),
            "skip" if !rest.is_empty() => with(Expected::Skip(rest.to_owned())),
            "cluster-only" if !rest.is_empty() => with(Expected::ClusterOnly(rest.to_owned())),
            _ => return Err(wrong()),
        };
        out.insert(test.to_owned(), entry);
    }
    Ok(out)
}

/// The core set in one mode: the `pass core` tests, and on `fjord dev` the `pass core-dev`
/// ones too (what `cargo xtask test` runs).
fn core(expectations: &BTreeMap<String, Expectation>, cluster: bool) -> Vec<String> {
    let wanted = |core: Core| core == Core::Both || (core == Core::Dev && !cluster);
    expectations.iter().filter(|(_, e)| wanted(e.core)).map(|(t, _)| t.clone()).collect()
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
/// (once per [`BUILD_KEY`]); returns the `tests` directory. The build goes to a
/// `.building` directory first, renamed into place only when it is complete, so an
/// interrupted build is never taken for a finished one.
fn build_suite(root: &Path) -> Result<PathBuf> {
    let tree = root.join(format!("target/conformance/librdkafka-{RDKAFKA_SYS}"));
    let tests = tree.join("tests");
    let stamp = |tree: &Path| tree.join(".xtask-build");
    if tests.join("test-runner").exists() && fs::read_to_string(stamp(&tree)).is_ok_and(|key| key == BUILD_KEY) {
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
    let building = root.join(format!("target/conformance/librdkafka-{RDKAFKA_SYS}.building"));
    if building.exists() {
        fs::remove_dir_all(&building)?;
    }
    fs::create_dir_all(building.parent().expect("under target/conformance"))?;
    run(Command::new("cp").arg("-r").arg(&source).arg(&building)).context("copying librdkafka out of the registry")?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get()).to_string();
    run(Command::new("./configure").args(CONFIGURE_FLAGS).current_dir(&building)).context("configuring librdkafka")?;
    run(Command::new("make").args(["-j", &jobs, "libs"]).current_dir(&building)).context("building librdkafka")?;
    run(Command::new("make").args(["-j", &jobs, "build"]).current_dir(building.join("tests")))
        .context("building librdkafka's test runner")?;
    fs::write(stamp(&building), BUILD_KEY)?;
    if tree.exists() {
        fs::remove_dir_all(&tree)?;
    }
    fs::rename(&building, &tree)?;
    Ok(tests)
}

/// What the tests run against, stopped when dropped.
trait Brokers {
    /// The PLAINTEXT listeners (the `kafka-topics.sh` stand-in's, and the tests' in a
    /// plaintext run).
    fn bootstrap(&self) -> &str;
    /// The SASL_SSL listeners, when the brokers were started with [`TlsFixtures`].
    fn sasl_ssl_bootstrap(&self) -> &str;
}

/// A free port on loopback (bound and released; the broker binds it right after).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `fjord dev` on free ports, stopped when dropped.
struct DevBroker {
    child: Child,
    bootstrap: String,
    sasl_ssl_bootstrap: String,
    _data: TempDir,
}

impl DevBroker {
    fn start(root: &Path, work: &Path, scenario: &str, security: Option<&TlsFixtures>) -> Result<Self> {
        let data = TempDir::new(work.join("data"))?;
        let port = free_port;
        let (broker, registry, http, grpc, metrics) = (port()?, port()?, port()?, port()?, port()?);
        let plaintext = format!("127.0.0.1:{broker}");
        let mut settings = vec![("listeners".to_owned(), format!("PLAINTEXT://{plaintext}"))];
        let mut sasl_ssl_bootstrap = String::new();
        if let Some(tls) = security {
            // The user goes into the embedded store before the broker opens it.
            add_scram_user(root, &["--data-dir".as_ref(), data.0.as_os_str()])?;
            sasl_ssl_bootstrap = format!("127.0.0.1:{}", port()?);
            settings = tls.broker_settings(&plaintext, &sasl_ssl_bootstrap);
        }
        let log = fs::File::create(work.join("fjord-dev.log"))?;
        let mut command = Command::new(root.join("target/debug/fjord"));
        for (key, value) in &settings {
            command.env(format!("FJORD_{}", key.to_ascii_uppercase().replace('.', "_")), value);
        }
        let child = command
            .arg("dev")
            .arg("--data-dir")
            .arg(&data.0)
            .env("FJORD_DEV_REGISTRY", format!("127.0.0.1:{registry}"))
            .env("FJORD_DEV_HTTP", format!("127.0.0.1:{http}"))
            .env("FJORD_DEV_GRPC", format!("127.0.0.1:{grpc}"))
            .env("FJORD_DEV_METRICS", format!("127.0.0.1:{metrics}"))
            // The suite's scenarios: 4 partitions per auto-created topic.
            .env("FJORD_NUM_PARTITIONS", "4")
            .env("FJORD_LOG_MIN_SEGMENT_BYTES", MIN_SEGMENT_BYTES)
            // For the ACL tests (0109, 0115, 0119): their ACLs are enforced, and where
            // none is set everyone may do everything, as without an authorizer.
            .env("FJORD_AUTHORIZER_ENABLE", "true")
            .env("FJORD_ALLOW_EVERYONE_IF_NO_ACL_FOUND", "true")
            .env("FJORD_AUTO_CREATE_TOPICS_ENABLE", if scenario == "noautocreate" { "false" } else { "true" })
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting fjord dev")?;
        let mut dev = Self { child, bootstrap: plaintext, sasl_ssl_bootstrap, _data: data };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(&dev.bootstrap).is_err() {
            if let Some(status) = dev.child.try_wait()? {
                bail!("fjord dev exited ({status}); see {}", work.join("fjord-dev.log").display());
            }
            if Instant::now() > deadline {
                bail!("fjord dev did not listen on {} within 60 s", dev.bootstrap);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(dev)
    }
}

impl Brokers for DevBroker {
    fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    fn sasl_ssl_bootstrap(&self) -> &str {
        &self.sasl_ssl_bootstrap
    }
}

impl Drop for DevBroker {
    fn drop(&mut self) {
        // The data goes with the temporary directory.
        stop(&mut self.child);
    }
}

/// SIGTERM for a clean stop, SIGKILL after 20 s.
fn stop(child: &mut Child) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Debian's ZooKeeper (the `zookeeper` package `cargo xtask provision` installs).
const ZOOKEEPER_CLASSPATH: &str = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";
/// The cluster's size, as in `deploy/cluster`.
const CLUSTER_BROKERS: i32 = 3;

/// A ZooKeeper and three `fjord broker` processes on free ports, all stopped when
/// dropped (brokers first, so none is left without its ZooKeeper).
struct ClusterBrokers {
    zookeeper: Child,
    brokers: Vec<Child>,
    bootstrap: String,
    sasl_ssl_bootstrap: String,
    _data: TempDir,
}

impl ClusterBrokers {
    fn start(root: &Path, work: &Path, scenario: &str, security: Option<&TlsFixtures>) -> Result<Self> {
        if !Path::new("/usr/share/java/zookeeper.jar").exists() {
            bail!("ZooKeeper is not installed: `cargo xtask provision` installs Debian's zookeeper package");
        }
        let data = TempDir::new(work.join("data"))?;
        let zk_port = free_port()?;
        let zk_config = data.0.join("zoo.cfg");
        fs::write(
            &zk_config,
            format!(
                "tickTime=500\ndataDir={}\nclientPort={zk_port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr\nmaxSessionTimeout=60000\n",
                data.0.join("zookeeper").display()
            ),
        )?;
        let zk_log = fs::File::create(work.join("zookeeper.log"))?;
        let zookeeper = Command::new("java")
            .args(["-Xmx256m", "-cp", ZOOKEEPER_CLASSPATH, "org.apache.zookeeper.server.ZooKeeperServerMain"])
            .arg(&zk_config)
            .stdin(Stdio::null())
            .stdout(zk_log.try_clone()?)
            .stderr(zk_log)
            .spawn()
            .context("starting ZooKeeper (java)")?;
        let mut cluster =
            Self { zookeeper, brokers: Vec::new(), bootstrap: String::new(), sasl_ssl_bootstrap: String::new(), _data: data };
        wait_zookeeper(zk_port, &mut cluster.zookeeper, &work.join("zookeeper.log"))?;
        let zookeeper_connect = format!("127.0.0.1:{zk_port}/fjord");
        if security.is_some() {
            add_scram_user(root, &["--zookeeper".as_ref(), zookeeper_connect.as_ref()])?;
        }
        let mut addresses = Vec::new();
        let mut sasl_ssl_addresses = Vec::new();
        for id in 1..=CLUSTER_BROKERS {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let listeners = match security {
                None => vec![("listeners".to_owned(), format!("PLAINTEXT://{addr}"))],
                Some(tls) => {
                    let sasl_ssl = format!("127.0.0.1:{}", free_port()?);
                    let settings = tls.broker_settings(&addr, &sasl_ssl);
                    sasl_ssl_addresses.push(sasl_ssl);
                    settings
                }
            };
            let listeners: String = listeners.iter().map(|(k, v)| format!("{k:?} = {v:?}\n")).collect();
            let config = cluster._data.0.join(format!("broker-{id}.toml"));
            fs::write(
                &config,
                format!(
                    "\"broker.id\" = {id}\n{listeners}\
                     \"zookeeper.connect\" = \"{zookeeper_connect}\"\n\
                     \"num.partitions\" = 4\n\"default.replication.factor\" = 3\n\"min.insync.replicas\" = 1\n\
                     \"log.min.segment.bytes\" = {MIN_SEGMENT_BYTES}\n\
                     \"authorizer.enable\" = true\n\"allow.everyone.if.no.acl.found\" = true\n\
                     \"auto.create.topics.enable\" = {}\n",
                    scenario != "noautocreate"
                ),
            )?;
            let log_path = work.join(format!("broker-{id}.log"));
            let log = fs::File::create(&log_path)?;
            let child = Command::new(root.join("target/debug/fjord"))
                .args(["broker", "--config"])
                .arg(&config)
                .arg("--data-dir")
                .arg(cluster._data.0.join(format!("broker-{id}")))
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting fjord broker")?;
            cluster.brokers.push(child);
            addresses.push((addr, log_path));
        }
        for (i, (addr, log)) in addresses.iter().enumerate() {
            wait_listening(addr, &mut cluster.brokers[i], &format!("broker {}", i + 1), log)?;
        }
        cluster.bootstrap = addresses.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>().join(",");
        cluster.sasl_ssl_bootstrap = sasl_ssl_addresses.join(",");
        // A broker listens only once it has registered; wait until the first one's
        // metadata lists all three, so no test starts against a partial cluster.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match metadata_broker_count(&addresses[0].0) {
                Ok(n) if n == CLUSTER_BROKERS => break,
                Ok(_) | Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
                Ok(n) => bail!("the cluster's metadata lists {n} of {CLUSTER_BROKERS} brokers after 60 s"),
                Err(e) => return Err(e.context("Metadata from broker 1")),
            }
        }
        Ok(cluster)
    }
}

impl Brokers for ClusterBrokers {
    fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    fn sasl_ssl_bootstrap(&self) -> &str {
        &self.sasl_ssl_bootstrap
    }
}

impl Drop for ClusterBrokers {
    fn drop(&mut self) {
        for child in &mut self.brokers {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
        }
        for child in &mut self.brokers {
            stop(child);
        }
        stop(&mut self.zookeeper);
    }
}

/// Waits until ZooKeeper answers `srvr` with its mode: it accepts connections before
/// it serves, and a broker that connects then loses its session at once.
fn wait_zookeeper(port: u16, child: &mut Child, log: &Path) -> Result<()> {
    use std::io::Write;
    let serving = || -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut answer = String::new();
        stream.write_all(b"srvr").is_ok() && stream.read_to_string(&mut answer).is_ok() && answer.contains("Mode:")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !serving() {
        if let Some(status) = child.try_wait()? {
            bail!("ZooKeeper exited ({status}); see {}", log.display());
        }
        if Instant::now() > deadline {
            bail!("ZooKeeper did not serve on port {port} within 60 s; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Waits until `addr` accepts connections, failing early when `child` exits.
fn wait_listening(addr: &str, child: &mut Child, what: &str, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited ({status}); see {}", log.display());
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on {addr} within 60 s; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The number of brokers in a Metadata v0 answer (all topics) from `addr`.
fn metadata_broker_count(addr: &str) -> Result<i32> {
    use std::io::Write;
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    // api_key 3 (Metadata), version 0, correlation id 1, client id "xtask", no topics
    // (v0: an empty list means all).
    let mut body = Vec::new();
    body.extend_from_slice(&3i16.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&1i32.to_be_bytes());
    body.extend_from_slice(&5i16.to_be_bytes());
    body.extend_from_slice(b"xtask");
    body.extend_from_slice(&0i32.to_be_bytes());
    let mut request = (body.len() as i32).to_be_bytes().to_vec();
    request.extend_from_slice(&body);
    stream.write_all(&request)?;
    // Size, correlation id, then the broker array's length.
    let mut head = [0u8; 12];
    stream.read_exact(&mut head)?;
    Ok(i32::from_be_bytes([head[8], head[9], head[10], head[11]]))
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

/// The security scenario's SCRAM user, created before the brokers start.
const SCRAM_USER: &str = "conformance";
const SCRAM_PASSWORD: &str = "conformance-secret";
/// The password of the client's PKCS#12 keystore (`ssl.key.password`).
const CLIENT_KEYSTORE_PASSWORD: &str = "conformance-keystore";

/// `fjord users add` of [`SCRAM_USER`] (both SCRAM mechanisms; PLAIN checks the same
/// credential), on the store `store_args` name (`--data-dir D` or `--zookeeper Z`).
fn add_scram_user(root: &Path, store_args: &[&std::ffi::OsStr]) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new(root.join("target/debug/fjord"))
        .args(["users", "add", SCRAM_USER, "--mechanism", "SCRAM-SHA-256", "--mechanism", "SCRAM-SHA-512", "--password-stdin"])
        .args(store_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .context("starting fjord users add")?;
    child.stdin.take().expect("piped").write_all(format!("{SCRAM_PASSWORD}\n").as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        bail!("fjord users add {SCRAM_USER} failed ({status})");
    }
    Ok(())
}

/// The files of the security scenario, made with `openssl` for one run in `dir`: a CA,
/// the brokers' certificate for 127.0.0.1 signed by it, and a client key and certificate
/// in the encodings 0097 loads them in (PEM, DER, PKCS#12 with the CA), where the suite's
/// own cluster tool (trivup) puts them too. The listeners ask for no client certificate:
/// on SASL_SSL, SASL says who the client is.
struct TlsFixtures {
    dir: PathBuf,
}

impl TlsFixtures {
    fn make(dir: &Path) -> Result<Self> {
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        fs::create_dir_all(dir)?;
        let openssl = |args: &[&str]| -> Result<()> {
            let output =
                Command::new("openssl").args(args).current_dir(dir).stdin(Stdio::null()).output().context("running openssl")?;
            if !output.status.success() {
                bail!("openssl {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
            }
            Ok(())
        };
        let ec_key = |name: &str| openssl(&["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name]);
        ec_key("ca.key")?;
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=fjord conformance CA",
            "-days",
            "30",
            "-out",
            "ca.pem",
        ])?;
        // Each certificate: a request, signed by the CA with the extensions in a file
        // (a leaf, with the names librdkafka checks the broker's against).
        let sign = |name: &str, subject: &str, extensions: &str| -> Result<()> {
            ec_key(&format!("{name}.key"))?;
            openssl(&["req", "-new", "-key", &format!("{name}.key"), "-subj", subject, "-out", &format!("{name}.csr")])?;
            fs::write(dir.join(format!("{name}.ext")), extensions)?;
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "30",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ])
        };
        sign(
            "server",
            "/CN=localhost",
            "basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        )?;
        sign("client", &format!("/CN={SCRAM_USER}"), "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n")?;
        // The broker's keystore: its key and certificate in one PEM file.
        let keystore = [fs::read(dir.join("server.key"))?, fs::read(dir.join("server.pem"))?].concat();
        fs::write(dir.join("server-keystore.pem"), keystore)?;
        openssl(&["x509", "-in", "client.pem", "-outform", "DER", "-out", "client.der"])?;
        openssl(&["pkey", "-in", "client.key", "-outform", "DER", "-out", "client.key.der"])?;
        openssl(&["x509", "-in", "ca.pem", "-outform", "DER", "-out", "ca.der"])?;
        let password = format!("pass:{CLIENT_KEYSTORE_PASSWORD}");
        openssl(&[
            "pkcs12",
            "-export",
            "-in",
            "client.pem",
            "-inkey",
            "client.key",
            "-certfile",
            "ca.pem",
            "-passout",
            &password,
            "-out",
            "client.p12",
        ])?;
        Ok(Self { dir: dir.to_owned() })
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// A broker's keys for a PLAINTEXT listener at `plaintext` (the brokers' own
    /// traffic, the topic tool stand-in's) and a SASL_SSL one at `sasl_ssl`.
    fn broker_settings(&self, plaintext: &str, sasl_ssl: &str) -> Vec<(String, String)> {
        [
            ("listeners", format!("PLAINTEXT://{plaintext},SASL_SSL://{sasl_ssl}")),
            ("inter.broker.listener.name", "PLAINTEXT".into()),
            ("ssl.keystore.type", "PEM".into()),
            ("ssl.keystore.location", self.path("server-keystore.pem")),
            ("ssl.truststore.location", self.path("ca.pem")),
            ("ssl.client.auth", "none".into()),
            ("sasl.enabled.mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN".into()),
            // KIP-368 sessions, so that 0142 re-authenticates (it skips itself where a
            // broker reports 0); other tests' clients re-authenticate every 10 s too.
            ("connections.max.reauth.ms", "10000".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The tests' `test.conf`: every client of every test connects over SASL_SSL as
    /// [`SCRAM_USER`], trusting the CA, with the client key and certificate set (0097
    /// swaps them for other encodings and other keys).
    fn client_conf(&self, bootstrap: &str) -> String {
        format!(
            "bootstrap.servers={bootstrap}\nsecurity.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-256\n\
             sasl.username={SCRAM_USER}\nsasl.password={SCRAM_PASSWORD}\nssl.ca.location={}\n\
             ssl.certificate.location={}\nssl.key.location={}\nssl.key.password={CLIENT_KEYSTORE_PASSWORD}\n",
            self.path("ca.pem"),
            self.path("client.pem"),
            self.path("client.key"),
        )
    }

    /// The `SSL_*` variables 0097 reads (as trivup sets them): the client's keystore
    /// and its password, its certificate, key and CA in each encoding, and the client
    /// authentication the listeners ask for.
    fn test_env(&self) -> Vec<(String, String)> {
        [
            ("SSL_pkcs", self.path("client.p12")),
            ("SSL_password", CLIENT_KEYSTORE_PASSWORD.to_owned()),
            ("SSL_pub_der", self.path("client.der")),
            ("SSL_pub_pem", self.path("client.pem")),
            ("SSL_priv_der", self.path("client.key.der")),
            ("SSL_priv_pem", self.path("client.key")),
            ("SSL_ca_der", self.path("ca.der")),
            ("SSL_all_cas_pem", self.path("ca.pem")),
            ("SSL_client_auth", "none".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// What every test run is given.
struct Env<'a> {
    conf: &'a Path,
    kafka_path: &'a Path,
    bootstrap: &'a str,
    /// The security scenario's `SSL_*` variables ([`TlsFixtures::test_env`]).
    extra: &'a [(String, String)],
}

/// Some tests call Kafka's `kafka-topics.sh` and `kafka-acls.sh` (found under
/// `$KAFKA_PATH/bin`); scripts in the run's `kafka/bin` stand in for them. The topics
/// tool's `--create` and `--delete` take the same flags as `fjord topics create|delete`,
/// and `--alter --partitions N` is `fjord topics alter --partitions N` (CreatePartitions);
/// for the ACL tool see [`kafka_acls_script`].
fn kafka_shims(root: &Path, work: &Path) -> Result<PathBuf> {
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
    let acls = kafka.join("bin/kafka-acls.sh");
    fs::write(&acls, kafka_acls_script(&root.join("target/venv/bin/python")))?;
    run(Command::new("chmod").arg("+x").arg(&acls))?;
    Ok(kafka)
}

/// `kafka-acls.sh --bootstrap-server B --add|--remove [--force] --allow-principal|--deny-principal
/// P --operation OP --allow-host|--deny-host H --topic|--group NAME`, as 0109, 0115 and
/// 0119 call it: a CreateAcls or DeleteAcls request over the Kafka protocol, sent by confluent-kafka's
/// AdminClient from the venv `cargo xtask provision` makes (the brokers run with
/// `authorizer.enable`, everyone allowed where no ACL says otherwise).
fn kafka_acls_script(python: &Path) -> String {
    format!(
        r#"#!{python}
# kafka-acls.sh as librdkafka's tests call it, over CreateAcls (cargo xtask conformance).
import sys
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,
                                   AdminClient, ResourcePatternType, ResourceType)

args, i, opts = sys.argv[1:], 0, {{}}
while i < len(args):
    if args[i] in ("--add", "--remove", "--list"):
        opts["action"] = args[i][2:]
        i += 1
    elif args[i] == "--force":
        i += 1
    elif i + 1 < len(args):
        opts[args[i][2:]] = args[i + 1]
        i += 2
    else:
        sys.exit(f"kafka-acls.sh stand-in: {{args[i]}} needs a value")
if opts.get("action") not in ("add", "remove"):
    sys.exit("kafka-acls.sh stand-in: only --add and --remove are supported")
allow = "allow-principal" in opts
principal = opts["allow-principal" if allow else "deny-principal"]
host = opts.get("allow-host" if allow else "deny-host", "*")
if "topic" in opts:
    kind, name = ResourceType.TOPIC, opts["topic"]
elif "group" in opts:
    kind, name = ResourceType.GROUP, opts["group"]
else:
    sys.exit("kafka-acls.sh stand-in: --topic or --group is needed")
operation = AclOperation[opts["operation"].upper()]
permission = AclPermissionType.ALLOW if allow else AclPermissionType.DENY
admin = AdminClient({{"bootstrap.servers": opts["bootstrap-server"]}})
if opts["action"] == "add":
    binding = AclBinding(kind, name, ResourcePatternType.LITERAL, principal, host, operation, permission)
    futures = admin.create_acls([binding], request_timeout=30)
else:
    binding = AclBindingFilter(kind, name, ResourcePatternType.LITERAL, principal, host, operation, permission)
    futures = admin.delete_acls([binding], request_timeout=30)
for future in futures.values():
    future.result()
"#,
        python = python.display()
    )
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
            o.result == Verdict::Fail && expectations.get(&o.test).is_some_and(|e| matches!(e.expected, Expected::KnownFail(_)))
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
    fn the_build_key_names_the_configure_flags_and_packages() {
        assert!(BUILD_KEY.contains(&CONFIGURE_FLAGS.join(" ")), "change BUILD_KEY with the flags, so old trees are rebuilt");
        // Packages added after the first build change what configure finds.
        for package in ["rapidjson-dev", "libssl-dev"] {
            assert!(BUILD_PACKAGES.iter().any(|(p, _)| *p == package));
            assert!(BUILD_KEY.contains(package), "BUILD_KEY names {package}, so old trees are rebuilt");
        }
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

    #[test]
    fn the_expectations_file_is_read_strictly() {
        let dir = std::env::temp_dir().join(format!("xtask-expect-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("e.txt");
        fs::write(
            &file,
            "# comment\n0001 pass core\n0002 pass\n0030 pass core-dev\n0113 pass timeout=900\n0081 known-fail #22: CreatePartitions\n",
        )
            .unwrap();
        let read = read_expectations(&file).unwrap();
        let pass = |core, secs| Expectation {
            expected: Expected::Pass,
            core,
            timeout: Duration::from_secs(secs),
            security: Security::Plaintext,
        };
        assert_eq!(read["0001"], pass(Core::Both, 300));
        assert_eq!(read["0002"], pass(Core::No, 300));
        assert_eq!(read["0030"], pass(Core::Dev, 300));
        assert_eq!(read["0113"], pass(Core::No, 900));
        assert_eq!(
            read["0081"],
            Expectation {
                expected: Expected::KnownFail("#22: CreatePartitions".into()),
                core: Core::No,
                timeout: TEST_TIMEOUT,
                security: Security::Plaintext,
            }
        );
        assert_eq!(core(&read, false), vec!["0001".to_string(), "0030".to_string()]);
        assert_eq!(core(&read, true), vec!["0001".to_string()], "core-dev stays out of the three-broker run");
        fs::write(&file, "0003 known-fail\n").unwrap();
        assert!(read_expectations(&file).is_err(), "a known-fail needs its reason");
        fs::write(&file, "0003 flaky\n").unwrap();
        assert!(read_expectations(&file).is_err());
        fs::write(&file, "0097 skip needs SSL\n0003 skip\n").unwrap();
        assert!(read_expectations(&file).is_err(), "a skip needs its reason");
        fs::write(&file, "0097 skip needs SSL\n").unwrap();
        assert_eq!(read_expectations(&file).unwrap()["0097"].expected, Expected::Skip("needs SSL".into()));
        fs::write(&file, "0098 cluster-only creates its topics with replication factor 3\n").unwrap();
        let cluster_only = read_expectations(&file).unwrap()["0098"].expected.clone();
        assert_eq!(cluster_only.in_mode(true), Expected::Pass);
        assert_eq!(
            cluster_only.in_mode(false),
            Expected::KnownFail("needs three brokers: creates its topics with replication factor 3".into())
        );
        fs::write(&file, "0003 pass timeout=long\n").unwrap();
        assert!(read_expectations(&file).is_err());
        fs::write(&file, "0135 sasl_ssl pass\n0142 sasl_ssl skip no KIP-368\n0001 pass\n").unwrap();
        let read = read_expectations(&file).unwrap();
        assert_eq!(read["0135"].security, Security::SaslSsl);
        assert_eq!(read["0135"].expected, Expected::Pass);
        assert_eq!(read["0142"].expected, Expected::Skip("no KIP-368".into()));
        assert_eq!(read["0001"].security, Security::Plaintext);
        for bad in ["0135 sasl_ssl\n", "0135 sasl_ssl pass core\n", "0135 sasl_ssl known-fail\n"] {
            fs::write(&file, bad).unwrap();
            assert!(read_expectations(&file).is_err(), "{bad:?}");
        }
        fs::write(&file, "0003 pass cor\n").unwrap();
        assert!(read_expectations(&file).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
