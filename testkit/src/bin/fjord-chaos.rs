//! `fjord-chaos --seed S --duration SECS [--faults LIST] [--json] [--history FILE]
//! [--fjord BINARY] [--verbose] [--plan]`: one chaos run (see `fjord_testkit::chaos`), run by
//! `cargo xtask chaos`. Prints the faults and the anomalies; with `--json` the last line
//! is one JSON object. Exit status 0: no violation; 1: violations; 2: the run could
//! not be done. `--plan` prints the seed's schedule and runs nothing.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use fjord_testkit::chaos::checker::AnomalyKind;
use fjord_testkit::chaos::run::{self, Options, RunOutcome};
use fjord_testkit::chaos::schedule::{self, FaultKind};

fn main() {
    // `--plan`: print the schedule the seed gives and stop (no root needed).
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--plan") {
        let args = args.into_iter().filter(|a| a != "--plan").collect();
        match parse(args).and_then(|(options, _)| run::plan(&options)) {
            Ok(plan) => {
                for p in &plan {
                    println!(
                        "{:>8.1}s {:<10} {:<24} {:>5.1}s {}",
                        p.start.as_secs_f64(),
                        p.kind.name(),
                        p.target.to_string(),
                        p.length.as_secs_f64(),
                        p.amount
                    );
                }
                println!("{} faults", plan.len());
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("fjord-chaos: {e:#}");
                std::process::exit(2);
            }
        }
    }
    match parse(std::env::args().skip(1).collect()).and_then(|(options, json)| Ok((run::run(options)?, json))) {
        Ok((outcome, json)) => {
            print_table(&outcome);
            if json {
                println!("{}", summary(&outcome));
            }
            std::process::exit(if outcome.report.violations() == 0 { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("fjord-chaos: {e:#}");
            std::process::exit(2);
        }
    }
}

fn parse(args: Vec<String>) -> Result<(Options, bool)> {
    let mut seed = 1u64;
    let mut duration = Duration::from_secs(60);
    let mut kinds = FaultKind::ALL.to_vec();
    let mut json = false;
    let mut verbose = false;
    let mut history = None;
    let mut fjord = None;
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--seed" => seed = value("--seed")?.parse().context("--seed: a number")?,
            "--duration" => duration = Duration::from_secs(value("--duration")?.parse().context("--duration: seconds")?),
            "--faults" => kinds = schedule::parse_kinds(&value("--faults")?)?,
            "--history" => history = Some(PathBuf::from(value("--history")?)),
            "--fjord" => fjord = Some(PathBuf::from(value("--fjord")?)),
            "--json" => json = true,
            "--verbose" | "-v" => verbose = true,
            other => bail!(
                "unknown argument {other:?}\nusage: fjord-chaos --seed S --duration SECS [--faults partition,isolate,one-way,zk-expire,loss,latency,netem,kill,pause,disk] [--json] [--history FILE] [--fjord BINARY] [--verbose] [--plan]"
            ),
        }
    }
    // The fjord binary sits next to this one in the target dir.
    let fjord = match fjord {
        Some(f) => f,
        None => std::env::current_exe()?.with_file_name("fjord"),
    };
    if !fjord.exists() && !std::env::args().any(|a| a == "--plan") {
        bail!("no fjord binary at {} (build it: cargo build -p fjord, or pass --fjord)", fjord.display());
    }
    let history = history.unwrap_or_else(|| std::env::temp_dir().join(format!("fjord-chaos-{seed}.jsonl")));
    Ok((Options { seed, duration, kinds, fjord, history, verbose }, json))
}

fn print_table(outcome: &RunOutcome) {
    let r = &outcome.report;
    println!("chaos run, seed {}: {} faults, {} operations", outcome.seed, outcome.faults.len(), r.operations);
    println!();
    println!("{:<12} {:>6}", "fault", "count");
    for (kind, count) in outcome.faults_by_kind() {
        println!("{kind:<12} {count:>6}");
    }
    println!();
    println!(
        "acknowledged: {} acks=all, {} acks=1; {} produces indeterminate; {} records read by consumers",
        r.acked_all, r.acked_one, r.indeterminate, r.records_read
    );
    println!("transactions acknowledged: {} committed, {} aborted", r.committed, r.aborted);
    println!();
    println!("{:<18} {:>6}", "anomaly", "count");
    for kind in AnomalyKind::ALL {
        let note = if kind.is_violation() { "" } else { "  (what acks=1 risks: not a violation)" };
        println!("{:<18} {:>6}{note}", kind.name(), r.count(kind));
    }
    println!("{:<18} {:>6}", "violations", r.violations());
    for exit in &outcome.unexpected_exits {
        println!("note: {exit}");
    }
    let shown: Vec<_> = r.anomalies.iter().filter(|a| a.kind.is_violation()).take(20).collect();
    if !shown.is_empty() {
        println!();
        for a in shown {
            println!("{} p{}: {}", a.kind, a.partition, a.detail);
        }
    }
    println!();
    println!("history: {}", outcome.history.display());
    if let Some(kept) = &outcome.kept {
        println!("broker logs and data kept in {}", kept.display());
    }
}

fn summary(outcome: &RunOutcome) -> serde_json::Value {
    let r = &outcome.report;
    serde_json::json!({
        "seed": outcome.seed,
        "faults": outcome.faults.len(),
        "faults_by_kind": outcome.faults_by_kind(),
        "operations": r.operations,
        "acked_all": r.acked_all,
        "acked_one": r.acked_one,
        "indeterminate": r.indeterminate,
        "records_read": r.records_read,
        "transactions_committed": r.committed,
        "transactions_aborted": r.aborted,
        "violations": r.violations(),
        "anomalies": r.counts(),
        "unexpected_exits": outcome.unexpected_exits,
        "history": outcome.history,
    })
}
