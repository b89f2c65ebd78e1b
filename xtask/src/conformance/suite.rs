//! librdkafka's test suite: its sources out of the cargo registry, its build in
//! `target/conformance/`, and the stand-ins for the Kafka tools some tests call.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::RDKAFKA_SYS;
use crate::{cargo, install_missing, run};

/// Debian packages the build needs (package, a file it installs).
pub(super) const BUILD_PACKAGES: &[(&str, &str)] = &[
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
pub(super) const CONFIGURE_FLAGS: &[&str] = &["--disable-gssapi", "--disable-curl", "--disable-lz4-ext"];
/// Written into a finished build; a tree built from other packages or flags (one from
/// before RapidJSON or OpenSSL was added) is built again.
pub(super) const BUILD_KEY: &str = "configure --disable-gssapi --disable-curl --disable-lz4-ext; with rapidjson-dev libssl-dev\n";

/// The librdkafka tree in the cargo registry, fetched there when missing.
pub(super) fn registry_source(root: &Path) -> Result<PathBuf> {
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
pub(super) fn build_suite(root: &Path) -> Result<PathBuf> {
    let tree = root.join(format!("target/conformance/librdkafka-{RDKAFKA_SYS}"));
    let tests = tree.join("tests");
    let stamp = |tree: &Path| tree.join(".xtask-build");
    if tests.join("test-runner").exists() && fs::read_to_string(stamp(&tree)).is_ok_and(|key| key == BUILD_KEY) {
        return Ok(tests);
    }
    install_missing(BUILD_PACKAGES, "librdkafka's build needs these packages")?;
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
/// Some tests call Kafka's `kafka-topics.sh` and `kafka-acls.sh` (found under
/// `$KAFKA_PATH/bin`); scripts in the run's `kafka/bin` stand in for them. The topics
/// tool's `--create` and `--delete` take the same flags as `fjord topics create|delete`,
/// and `--alter --partitions N` is `fjord topics alter --partitions N` (CreatePartitions);
/// for the ACL tool see [`kafka_acls_script`].
pub(super) fn kafka_shims(root: &Path, work: &Path) -> Result<PathBuf> {
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
pub(super) fn kafka_acls_script(python: &Path) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_key_names_the_configure_flags_and_packages() {
        assert!(BUILD_KEY.contains(&CONFIGURE_FLAGS.join(" ")), "change BUILD_KEY with the flags, so old trees are rebuilt");
        // Packages added after the first build change what configure finds.
        for package in ["rapidjson-dev", "libssl-dev"] {
            assert!(BUILD_PACKAGES.iter().any(|(p, _)| *p == package));
            assert!(BUILD_KEY.contains(package), "BUILD_KEY names {package}, so old trees are rebuilt");
        }
    }
}
