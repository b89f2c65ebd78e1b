//! `cargo xtask chaos --seed S --duration SECS [--faults LIST] [--json]`: builds the
//! `fjord` broker and the `fjord-chaos` runner (fjord-testkit's `chaos` module) and runs
//! one seeded fault schedule against a three-broker cluster in network namespaces,
//! then prints the faults and the anomalies the history checker found (with `--json`,
//! the last line is one JSON object). Fails when any anomaly breaks a guarantee.
//! Needs root (namespaces, nftables, a tmpfs), like `cargo xtask test`.
//!
//! `cargo xtask test` runs a short schedule with every fault kind once as a test of the
//! workspace (fjord-testkit's `tests/chaos_short.rs`: seed 1, 90 s), so it uses the
//! binaries that build made.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{cargo, root, run};

pub(crate) fn chaos(args: &[String]) -> Result<()> {
    let root = root();
    run(cargo(&root).args(["build", "--quiet", "-p", "fjord", "--bin", "fjord", "-p", "fjord-testkit", "--bin", "fjord-chaos"]))
        .context("building the broker and the chaos runner")?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| root.join("target"));
    let bin = target.join("debug");
    let mut cmd = Command::new(bin.join("fjord-chaos"));
    cmd.arg("--fjord").arg(bin.join("fjord")).args(args);
    if !args.iter().any(|a| a == "--history") {
        let seed = args.iter().position(|a| a == "--seed").and_then(|i| args.get(i + 1)).map_or("1", String::as_str);
        cmd.arg("--history").arg(target.join("chaos").join(format!("history-seed{seed}.jsonl")));
    }
    let status = cmd.status().context("could not start fjord-chaos")?;
    match status.code() {
        Some(0) => Ok(()),
        Some(1) => bail!("the chaos run found violations (its table above lists them; the history file is kept)"),
        _ => bail!("the chaos run could not be done: {status}"),
    }
}
