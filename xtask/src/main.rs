//! `cargo xtask test`: install what the tests need on a fresh Debian machine, check the
//! formatting, run every test of the workspace (several test binaries at a time, see
//! [`testrun`]), then clippy with warnings as errors, then the core set of librdkafka's
//! own integration tests on `fjord dev` and on three brokers, side by side (`cargo xtask
//! conformance [--cluster]` runs one, see [`conformance`]; `FJORD_SKIP_CONFORMANCE=1`
//! leaves them out). The short chaos run (fjord-testkit's `tests/chaos_short.rs`, see
//! [`chaos`]) is one of the workspace's tests.
//! `.ci/run` calls exactly this. With extra arguments (`cargo xtask test -- NAME`) only
//! the selected tests run, without the format and lint checks.
//!
//! Provisioning is idempotent: each tool is looked for first and installed only when
//! missing, so a developer machine that already has them pays nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

mod chaos;
mod conformance;
mod testrun;

/// Debian packages the integration tests run: a real ZooKeeper server, kcat
/// (librdkafka) as an independent Kafka client, nc for health checks, the Python venv
/// module, Node.js with npm (KafkaJS), and Chromium. Each is `(package, a file it
/// installs)`.
const APT_PACKAGES: &[(&str, &str)] = &[
    ("kcat", "/usr/bin/kcat"),
    ("zookeeper", "/usr/share/java/zookeeper.jar"),
    ("netcat-openbsd", "/bin/nc.openbsd"),
    ("python3-venv", "/usr/share/doc/python3-venv"),
    ("nodejs", "/usr/bin/node"),
    ("npm", "/usr/bin/npm"),
    // Headless browser that opens the audit's HTML report in its test.
    ("chromium", "/usr/bin/chromium"),
    // Network namespaces, veth pairs and the fault rules of the chaos run.
    ("iproute2", "/usr/sbin/ip"),
    ("nftables", "/usr/sbin/nft"),
    ("iptables", "/usr/sbin/iptables"),
];

/// Python packages installed into `target/venv`: independent clients for the tests
/// (librdkafka's Python binding with its schema-registry and Avro serializers,
/// kafka-python, and gRPC for the gateway).
const PYTHON_PACKAGES: &[&str] = &["confluent-kafka[avro,schemaregistry]==2.*", "kafka-python>=2.0", "grpcio", "grpcio-tools"];
/// What the tests import; a venv missing any of them is topped up with pip.
const PYTHON_IMPORTS: &str = "import confluent_kafka, confluent_kafka.schema_registry.avro, fastavro, kafka, grpc, grpc_tools";

/// KafkaJS, the independent JavaScript client of the tests (it has no dependencies of
/// its own), and where it is installed (`npm install --prefix`) below the workspace root.
const KAFKAJS_VERSION: &str = "2.2.4";
const NODE_PREFIX: &str = "target/node";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The error and its causes, without the backtrace anyhow's Debug adds under
    // RUST_BACKTRACE: CI shows the end of the output, which should be what failed.
    if let Err(e) = dispatch(&args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn dispatch(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("provision") => provision(),
        Some("conformance") => conformance::conformance(&args[1..]),
        Some("chaos") => chaos::chaos(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask test [-- cargo test args]\n       cargo xtask provision\n       cargo xtask conformance [--tests 0001,...] [--all] [--scenario default|noautocreate] [--idempotent] [--cluster]\n       cargo xtask chaos --seed S --duration SECS [--faults partition,isolate,one-way,zk-expire,loss,latency,netem,kill,pause,disk] [--json]"
            );
            std::process::exit(2);
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn test(extra: &[String]) -> Result<()> {
    provision()?;
    let root = root();
    let whole_run = extra.is_empty();
    if whole_run {
        // The build and the brokers' data need ~25 GB; a run on a nearly full disk fails
        // late and far from the cause, so the output starts with what there was.
        let _ = Command::new("df").args(["-h"]).arg(&root).status();
        // Seconds, so it goes first: a formatting slip fails before the long test run.
        run(cargo(&root).args(["fmt", "--all", "--check"])).context("code is not formatted: run `cargo fmt --all`")?;
    }
    // Tests find the independent Python clients and KafkaJS here.
    let python = root.join("target/venv/bin/python");
    let node_modules = root.join(NODE_PREFIX).join("node_modules");
    let clients = [("FJORD_TEST_PYTHON", python.as_path()), ("FJORD_TEST_NODE_MODULES", node_modules.as_path())];
    if !whole_run {
        return run(cargo(&root).args(["test", "--workspace", "--no-fail-fast"]).args(extra).envs(clients));
    }
    testrun::run_workspace_tests(&root, &clients)?;
    run(cargo(&root).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))
        .context("clippy found warnings")?;
    if std::env::var_os("FJORD_SKIP_CONFORMANCE").is_none() {
        // The core set on one broker and on three, side by side (about 3 minutes).
        conformance::core_sets()?;
    }
    Ok(())
}

fn cargo(root: &Path) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root);
    cmd
}

fn provision() -> Result<()> {
    install_missing(APT_PACKAGES, "the integration tests need these packages")?;
    let venv = root().join("target/venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        eprintln!("xtask: creating the Python venv for independent clients in target/venv");
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    let have = Command::new(&python).args(["-c", PYTHON_IMPORTS]).output()?;
    if !have.status.success() {
        run(Command::new(&python).args(["-m", "pip", "install", "--quiet"]).args(PYTHON_PACKAGES))
            .context("pip install of the Python Kafka clients failed")?;
    }
    provision_kafkajs(&root().join(NODE_PREFIX))
}

/// KafkaJS into `prefix`, unless that version is there.
fn provision_kafkajs(prefix: &Path) -> Result<()> {
    let manifest = prefix.join("node_modules/kafkajs/package.json");
    let installed = std::fs::read_to_string(&manifest).unwrap_or_default();
    if installed.contains(&format!("\"version\": \"{KAFKAJS_VERSION}\"")) {
        return Ok(());
    }
    eprintln!("xtask: installing KafkaJS {KAFKAJS_VERSION} in {}", prefix.display());
    std::fs::create_dir_all(prefix)?;
    run(Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--no-save", "--loglevel=error", "--prefix"])
        .arg(prefix)
        .arg(format!("kafkajs@{KAFKAJS_VERSION}")))
    .context("npm install of KafkaJS failed")
}

/// Installs with apt-get those of `packages` (package, a file it installs) whose file is
/// missing; `why` goes into the error when the install fails.
fn install_missing(packages: &[(&str, &str)], why: &str) -> Result<()> {
    let missing: Vec<&str> = packages.iter().filter(|(_, probe)| !Path::new(probe).exists()).map(|(pkg, _)| *pkg).collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
    .with_context(|| format!("apt-get install failed: {why} (run as root)"))
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}
