//! The short chaos run of `cargo xtask test` (#21): seed 1, every fault kind once,
//! about two minutes, against the `fjord` binary of this build. It needs root
//! (network namespaces, nftables, a tmpfs) and fails with the reason without it.
//! Longer runs: `cargo xtask chaos --seed S --duration SECS`.

use std::path::Path;
use std::time::Duration;

use fjord_testkit::chaos::run::{self, Options};
use fjord_testkit::chaos::schedule::FaultKind;

#[test]
fn a_short_seeded_schedule_of_every_fault_kind_keeps_what_acks_all_acknowledged() {
    // `cargo test --workspace` builds the fjord binary (its crate's tests use it) next
    // to this package's runner.
    let fjord = Path::new(env!("CARGO_BIN_EXE_fjord-chaos")).with_file_name("fjord");
    assert!(fjord.exists(), "no fjord binary at {} (cargo build -p fjord)", fjord.display());
    let history = std::env::temp_dir().join(format!("fjord-chaos-ci-{}.jsonl", std::process::id()));
    let outcome = run::run(Options {
        seed: 1,
        duration: Duration::from_secs(90),
        kinds: FaultKind::ALL.to_vec(),
        fjord,
        history: history.clone(),
        verbose: true,
    })
    .expect("the chaos run could not be done");
    let by_kind = outcome.faults_by_kind();
    eprintln!("faults {by_kind:?}; {:#?}", outcome.report.counts());
    for kind in FaultKind::ALL {
        assert!(by_kind.contains_key(kind.name()), "{kind} did not run: {by_kind:?}");
    }
    let report = &outcome.report;
    assert!(report.acked_all > 100 && report.records_read > 100, "too little work to judge: {report:?}");
    assert!(report.committed > 10 && report.aborted > 3, "too few transactions to judge: {report:?}");
    let violations: Vec<_> = report.anomalies.iter().filter(|a| a.kind.is_violation()).take(30).collect();
    assert!(
        violations.is_empty(),
        "{} violations (history {}, broker logs {:?}):\n{violations:#?}",
        report.violations(),
        history.display(),
        outcome.kept
    );
    let _ = std::fs::remove_file(history);
}
