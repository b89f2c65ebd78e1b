//! The client tools over a SASL_SSL listener: `fjord topics`, `produce` and `consume` with
//! `--command-config` (SCRAM-SHA-256 over TLS) against a real in-process broker; a wrong
//! password is an authentication failure with a non-zero exit; a plaintext client on the
//! TLS port fails within its connect timeout instead of hanging.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use fjord_auth::{ScramCredential, ScramMechanism};
use fjord_broker::BrokerConfig;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

const PASSWORD: &str = "alice-secret";
/// Bound on one `fjord` run: far above a healthy run, far below a hang.
const RUN_LIMIT: Duration = Duration::from_secs(60);

fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA (`ca.pem`) and a server certificate for 127.0.0.1 signed by it, key and chain in
/// one PEM file (`server-keystore.pem`, as `ssl.keystore.location` takes it).
fn make_certs(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-noenc"];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=Fjord Test CA"]);
    openssl(dir, &ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend(["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]);
    openssl(dir, &csr);
    std::fs::write(dir.join("server.ext"), "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    let keystore = [std::fs::read(dir.join("server.key")).unwrap(), std::fs::read(dir.join("server.pem")).unwrap()].concat();
    std::fs::write(dir.join("server-keystore.pem"), keystore).unwrap();
}

struct SecureBroker {
    sasl_ssl: SocketAddr,
    dir: tempfile::TempDir,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<fjord_broker::Result<()>>,
}

impl SecureBroker {
    /// A broker whose client listener is SASL_SSL (SCRAM-SHA-256, user `alice`).
    async fn start() -> Self {
        Self::start_as("alice", PASSWORD).await
    }

    /// A broker whose client listener is SASL_SSL (SCRAM-SHA-256), with one user.
    async fn start_as(user: &str, password: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        make_certs(dir.path());
        let mut config = BrokerConfig { log_dir: dir.path().join("data"), ..BrokerConfig::default() };
        config.set("listeners", "SASL_SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0").unwrap();
        config.set("inter.broker.listener.name", "PLAINTEXT").unwrap();
        config.set("ssl.keystore.location", dir.path().join("server-keystore.pem").to_str().unwrap()).unwrap();
        config.set("sasl.enabled.mechanisms", "SCRAM-SHA-256").unwrap();
        let bound = fjord_broker::server::bind(&config).await.unwrap();
        let sasl_ssl = bound[0].local_addr().unwrap();
        std::fs::create_dir_all(&config.log_dir).unwrap();
        let store = fjord_broker::server::open_store(&config).await.unwrap();
        let credential = ScramCredential::generate(ScramMechanism::Sha256, password, 4096).unwrap();
        fjord_auth::store::set_credential(&*store, user, ScramMechanism::Sha256, &credential).await.unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(fjord_broker::server::run_listeners(config, store, bound, shutdown.clone()));
        Self { sasl_ssl, dir, shutdown, task }
    }

    /// A Kafka client properties file for the SASL_SSL listener as `alice` with `password`.
    fn properties(&self, name: &str, password: &str) -> PathBuf {
        self.properties_as(name, "alice", password)
    }

    /// A Kafka client properties file for the SASL_SSL listener as `user` with `password`.
    fn properties_as(&self, name: &str, user: &str, password: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        let ca = self.dir.path().join("ca.pem");
        std::fs::write(
            &path,
            format!(
                "# SASL_SSL as {user}\nbootstrap.servers={}\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n\
                 sasl.username={user}\nsasl.password={password}\nssl.ca.location={}\n",
                self.sasl_ssl,
                ca.display()
            ),
        )
        .unwrap();
        path
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// Runs `fjord args` with `stdin`, bounded by [`RUN_LIMIT`] (a hang fails the test).
async fn fjord(args: &[&str], stdin: &str) -> Output {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(args)
        .env("RUST_LOG", "warn")
        // The test's own settings only: the file names the bootstrap and the security.
        .env_remove("FJORD_BOOTSTRAP")
        .env_remove("FJORD_SASL_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    tokio::time::timeout(RUN_LIMIT, child.wait_with_output()).await.expect("fjord did not finish in time").unwrap()
}

async fn ok(args: &[&str], stdin: &str) -> String {
    let out = fjord(args, stdin).await;
    assert!(out.status.success(), "fjord {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_produce_and_consume_over_sasl_ssl_with_a_command_config() {
    let broker = SecureBroker::start().await;
    let props = broker.properties("alice.properties", PASSWORD);
    let config = props.to_str().unwrap();
    ok(&["topics", "create", "--topic", "orders", "--partitions", "2", "--command-config", config], "").await;
    let listed = ok(&["topics", "list", "--command-config", config], "").await;
    assert!(listed.lines().any(|l| l == "orders"), "{listed}");
    ok(&["produce", "--topic", "orders", "--partition", "0", "--command-config", config], "one\ntwo\nthree\n").await;
    let consumed = ok(
        &[
            "consume",
            "--topic",
            "orders",
            "--partition",
            "0",
            "--from",
            "beginning",
            "--max-messages",
            "3",
            "--command-config",
            config,
        ],
        "",
    )
    .await;
    assert_eq!(consumed, "one\ntwo\nthree\n");
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_authentication_failure_and_a_plaintext_client_fails_fast() {
    let broker = SecureBroker::start().await;
    let props = broker.properties("wrong.properties", "not-the-password");
    let out = fjord(&["topics", "list", "--command-config", props.to_str().unwrap()], "").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a wrong password was accepted");
    assert!(stderr.contains("authentication failed") && stderr.contains("alice"), "{stderr}");
    assert!(!stderr.contains("not-the-password"), "the password was printed: {stderr}");

    // No properties: a plaintext ApiVersions on the TLS port. The broker takes it for a
    // bad ClientHello; whatever it does, the client must give up within its timeout.
    let started = std::time::Instant::now();
    let addr = broker.sasl_ssl.to_string();
    let out = fjord(&["topics", "list", "--bootstrap", &addr, "--connect-timeout-ms", "3000"], "").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a plaintext client got through a SASL_SSL listener");
    assert!(stderr.contains(&addr), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());

    // A mechanism the listener does not offer, and a CA the broker's certificate does not
    // chain to, each fail with their own error.
    let good = std::fs::read_to_string(broker.properties("good.properties", PASSWORD)).unwrap();
    let other_ca = broker.dir.path().join("other-ca");
    std::fs::create_dir(&other_ca).unwrap();
    make_certs(&other_ca);
    for (name, text, expected) in [
        ("sha512.properties", good.replace("SCRAM-SHA-256", "SCRAM-SHA-512"), "does not support SASL mechanism SCRAM-SHA-512"),
        (
            "other-ca.properties",
            good.replace(&broker.dir.path().join("ca.pem").display().to_string(), &other_ca.join("ca.pem").display().to_string()),
            "TLS handshake with",
        ),
    ] {
        let path = broker.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = fjord(&["topics", "list", "--command-config", path.to_str().unwrap()], "").await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(expected), "{name}: {stderr}");
    }

    // The same properties through FJORD_* variables instead of a file.
    let ca = broker.dir.path().join("ca.pem");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["topics", "list", "--bootstrap", &addr])
        .env("RUST_LOG", "warn")
        .env("FJORD_SECURITY_PROTOCOL", "SASL_SSL")
        .env("FJORD_SASL_USERNAME", "alice")
        .env("FJORD_SASL_PASSWORD", PASSWORD)
        .env("FJORD_SSL_CA_LOCATION", &ca)
        .output();
    let out = tokio::time::timeout(RUN_LIMIT, out).await.unwrap().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    broker.stop().await;
}

/// `fjord load` reads a SASL_SSL cluster with --command-config (and publishes its audit
/// counts over the same settings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_reads_over_sasl_ssl_with_a_command_config() {
    let broker = SecureBroker::start().await;
    let props = broker.properties("alice.properties", PASSWORD);
    let config = props.to_str().unwrap();
    ok(&["produce", "--topic", "clicks", "--command-config", config], "a\nb\nc\n").await;
    let dest = broker.dir.path().join("hdfs");
    let dest = format!("file://{}", dest.display());
    let out = ok(&["load", "--topics", "clicks", "--dest", &dest, "--audit-cluster", "dc", "--command-config", config], "").await;
    assert!(out.contains("3 records"), "{out}");
    let consumed =
        ok(&["consume", "--topic", "_audit", "--from", "beginning", "--max-messages", "1", "--command-config", config], "").await;
    assert!(consumed.contains("loader"), "no loader audit record: {consumed}");
    // Without the file, the loader cannot get in.
    let addr = broker.sasl_ssl.to_string();
    let out =
        fjord(&["load", "--topics", "clicks", "--dest", &dest, "--bootstrap", &addr, "--connect-timeout-ms", "2000"], "").await;
    assert!(!out.status.success(), "a loader without credentials read a SASL_SSL cluster");
    broker.stop().await;
}

/// `fjord mirror` reaches a source and a target with different identities: the source's
/// from `--source-config ALIAS=FILE`, the target's from `--target-config FILE` with its
/// password from FJORD_TARGET_SASL_PASSWORD; neither identity exists on the other cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_takes_separate_source_and_target_security() {
    let source = SecureBroker::start_as("reader", "reader-secret").await;
    let target = SecureBroker::start_as("writer", "writer-secret").await;
    let source_props = source.properties_as("reader.properties", "reader", "reader-secret");
    let target_props = target.properties_as("writer.properties", "writer", "writer-secret");
    let without_password = std::fs::read_to_string(&target_props).unwrap().replace("sasl.password=writer-secret\n", "");
    let target_file = target.dir.path().join("writer-no-password.properties");
    std::fs::write(&target_file, without_password).unwrap();
    ok(&["produce", "--topic", "orders", "--command-config", source_props.to_str().unwrap()], "x\ny\n").await;

    let mut mirror = tokio::process::Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["mirror", "--source", &format!("dc1={}", source.sasl_ssl), "--target", &target.sasl_ssl.to_string()])
        .args(["--topics", "orders", "--source-config", &format!("dc1={}", source_props.display())])
        .args(["--target-config", target_file.to_str().unwrap(), "--topic-refresh", "1s"])
        .env("RUST_LOG", "warn")
        .env("FJORD_TARGET_SASL_PASSWORD", "writer-secret")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The mirror creates `orders` on the target once it has connected to both sides.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let target_config = target_props.to_str().unwrap();
    while !ok(&["topics", "list", "--command-config", target_config], "").await.lines().any(|l| l == "orders") {
        if let Ok(Some(status)) = mirror.try_wait() {
            let mut stderr = String::new();
            tokio::io::AsyncReadExt::read_to_string(mirror.stderr.as_mut().unwrap(), &mut stderr).await.unwrap();
            panic!("the mirror exited ({status}): {stderr}");
        }
        assert!(std::time::Instant::now() < deadline, "the mirror did not create orders on the target");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let consumed = ok(
        &["consume", "--topic", "orders", "--from", "beginning", "--max-messages", "2", "--command-config", target_config],
        "",
    )
    .await;
    assert_eq!(consumed, "x\ny\n");
    mirror.start_kill().unwrap();
    let _ = mirror.wait().await;

    // An alias no --source has is refused before anything connects.
    let out = fjord(
        &[
            "mirror",
            "--source",
            &format!("dc1={}", source.sasl_ssl),
            "--target",
            &target.sasl_ssl.to_string(),
            "--topics",
            "orders",
            "--source-config",
            &format!("dc9={}", source_props.display()),
        ],
        "",
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no --source has the alias \"dc9\""), "{stderr}");
    source.stop().await;
    target.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_acls_change_through_a_running_broker() {
    // As kafka-configs and kafka-acls with --bootstrap-server: the broker keeps running,
    // and the user made through it can log in at once.
    let broker = SecureBroker::start().await;
    let admin = broker.properties("alice.properties", PASSWORD);
    let admin = admin.to_str().unwrap();
    let bob = broker.properties_as("bob.properties", "bob", "bob-pw");
    let bob = bob.to_str().unwrap();
    let out = fjord(&["topics", "list", "--command-config", bob], "").await;
    assert!(!out.status.success(), "bob does not exist yet");

    ok(&["users", "add", "bob", "--password-stdin", "--iterations", "8192", "--command-config", admin], "bob-pw\n").await;
    let users = ok(&["users", "list", "--command-config", admin], "").await;
    assert_eq!(users, "alice\tSCRAM-SHA-256\t4096\nbob\tSCRAM-SHA-256\t8192\n");
    ok(&["topics", "list", "--command-config", bob], "").await;

    let granted = ok(
        &["acls", "add", "--principal", "User:bob", "--operation", "Read", "--topic", "orders", "--command-config", admin],
        "",
    )
    .await;
    assert_eq!(granted, "Allow User:bob Read from * on Topic:LITERAL:orders\n");
    let listed = ok(&["acls", "list", "--principal", "User:bob", "--command-config", admin], "").await;
    assert_eq!(listed, granted);
    let removed = ok(&["acls", "remove", "--topic", "orders", "--command-config", admin], "").await;
    assert_eq!(removed, format!("removed {granted}"));
    assert_eq!(ok(&["acls", "list", "--command-config", admin], "").await, "");

    ok(&["users", "delete", "bob", "--command-config", admin], "").await;
    let out = fjord(&["topics", "list", "--command-config", bob], "").await;
    assert!(!out.status.success(), "bob's credential is gone");
    let out = fjord(&["users", "delete", "nobody", "--command-config", admin], "").await;
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such credentials"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = fjord(&["users", "list", "--command-config", admin, "--zookeeper", "127.0.0.1:1"], "").await;
    assert!(String::from_utf8_lossy(&out.stderr).contains("give one"), "{}", String::from_utf8_lossy(&out.stderr));
    broker.stop().await;
}
