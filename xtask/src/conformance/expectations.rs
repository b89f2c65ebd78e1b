//! `xtask/conformance.txt`: what each of librdkafka's broker-facing tests is expected to
//! do here, read strictly so that a typo cannot turn a test's expectation off.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use super::TEST_TIMEOUT;

/// What one test is expected to do, from `xtask/conformance.txt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Expected {
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
    pub(super) fn in_mode(&self, cluster: bool) -> Expected {
        match self {
            Expected::ClusterOnly(_) if cluster => Expected::Pass,
            Expected::ClusterOnly(reason) => Expected::KnownFail(format!("needs three brokers: {reason}")),
            other => other.clone(),
        }
    }
}

/// How the tests' clients reach the brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Security {
    /// PLAINTEXT, no authentication: every test but the security scenario's.
    Plaintext,
    /// The suite's security scenario: a SASL_SSL listener (TLS, SCRAM-SHA-256).
    SaslSsl,
}

impl Security {
    pub(super) fn parse(name: &str) -> Option<Self> {
        match name {
            "plaintext" => Some(Self::Plaintext),
            "sasl_ssl" => Some(Self::SaslSsl),
            _ => None,
        }
    }
}

/// One line of `xtask/conformance.txt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Expectation {
    pub(super) expected: Expected,
    /// In the core set, and in which modes.
    pub(super) core: Core,
    /// How long the test may take: [`TEST_TIMEOUT`] unless the line says `timeout=SECONDS`
    /// (a test the suite itself runs for many minutes).
    pub(super) timeout: Duration,
    /// The run it belongs to: [`Security::SaslSsl`] when the line says `sasl_ssl` after
    /// the test (the runner skips it without the security scenario).
    pub(super) security: Security,
}

/// Which core sets a test is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Core {
    No,
    /// `core`: on one broker and on three.
    Both,
    /// `core-dev`: on `fjord dev` only. A test of single-broker behaviour that takes long
    /// (0030, 50 s) is run once, so CI's three-broker pass stays on what three brokers change.
    Dev,
    /// `cluster-only core REASON`: on three brokers only, the one mode it can pass in.
    Cluster,
}

/// `xtask/conformance.txt`: `NNNN [sasl_ssl] pass [core|core-dev] [timeout=SECONDS]`,
/// `NNNN [sasl_ssl] known-fail REASON`, `... cluster-only [core] REASON` or `... skip
/// REASON`, `#` comments.
pub(super) fn read_expectations(path: &Path) -> Result<BTreeMap<String, Expectation>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let wrong = || {
            anyhow::anyhow!(
                "{}:{}: `NNNN [sasl_ssl] pass [core|core-dev] [timeout=SECONDS]`, `known-fail REASON`, `cluster-only [core] REASON` or `skip REASON`, not {line:?}",
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
            "cluster-only" if !rest.is_empty() => match rest.split_once(' ').map(|(flag, reason)| (flag, reason.trim())) {
                // The core set is one plaintext run (CI's), and a line says why.
                Some(("core", reason)) if security == Security::Plaintext && !reason.is_empty() => {
                    Expectation { core: Core::Cluster, ..with(Expected::ClusterOnly(reason.to_owned())) }
                }
                Some(("core", _)) => return Err(wrong()),
                _ if rest == "core" => return Err(wrong()),
                _ => with(Expected::ClusterOnly(rest.to_owned())),
            },
            _ => return Err(wrong()),
        };
        out.insert(test.to_owned(), entry);
    }
    Ok(out)
}

/// The core set in one mode: the `pass core` tests, on `fjord dev` the `pass core-dev`
/// ones too, and on three brokers the `cluster-only core` ones (what `cargo xtask test`
/// runs).
pub(super) fn core(expectations: &BTreeMap<String, Expectation>, cluster: bool) -> Vec<String> {
    let wanted = |core: Core| match core {
        Core::No => false,
        Core::Both => true,
        Core::Dev => !cluster,
        Core::Cluster => cluster,
    };
    expectations.iter().filter(|(_, e)| wanted(e.core)).map(|(t, _)| t.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expectations_file_is_read_strictly() {
        let dir = std::env::temp_dir().join(format!("xtask-expect-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("e.txt");
        fs::write(
            &file,
            "# comment\n0001 pass core\n0002 pass\n0030 pass core-dev\n0113 pass timeout=900\n0081 known-fail #22: CreatePartitions\n0103 cluster-only core replication factor 3\n",
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
        assert_eq!(read["0103"].core, Core::Cluster);
        assert_eq!(read["0103"].expected, Expected::ClusterOnly("replication factor 3".into()));
        assert_eq!(core(&read, false), vec!["0001".to_string(), "0030".to_string()]);
        assert_eq!(
            core(&read, true),
            vec!["0001".to_string(), "0103".to_string()],
            "core-dev stays out of the three-broker run; cluster-only core is only in it"
        );
        fs::write(&file, "0103 cluster-only core\n").unwrap();
        assert!(read_expectations(&file).is_err(), "cluster-only core needs its reason");
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
        for bad in [
            "0135 sasl_ssl\n",
            "0135 sasl_ssl pass core\n",
            "0135 sasl_ssl known-fail\n",
            "0135 sasl_ssl cluster-only core rf 3\n",
        ] {
            fs::write(&file, bad).unwrap();
            assert!(read_expectations(&file).is_err(), "{bad:?}");
        }
        fs::write(&file, "0003 pass cor\n").unwrap();
        assert!(read_expectations(&file).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
