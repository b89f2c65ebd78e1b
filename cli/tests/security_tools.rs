//! `fjord users` and `fjord acls` on the metadata store: the embedded store of a stopped
//! broker (`--data-dir`) and ZooKeeper (`--zookeeper`), checked by reading the store back
//! through `fjord_auth`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use fjord_auth::scram::ScramMechanism;
use fjord_auth::{store, Operation, Permission, Principal, Resource};
use fjord_coord::{EmbeddedStore, MetadataStore, ZooKeeperStore};

fn fjord(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn ok(args: &[&str], stdin: &str) -> String {
    let out = fjord(args, stdin);
    assert!(out.status.success(), "fjord {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str], stdin: &str) -> String {
    let out = fjord(args, stdin);
    assert!(!out.status.success(), "fjord {args:?} succeeded");
    String::from_utf8(out.stderr).unwrap()
}

/// The scenario, once per backend; `at` are the flags naming the store.
fn users_and_acls(at: &[&str]) {
    let with = |args: &[&str]| -> Vec<String> { args.iter().chain(at).map(ToString::to_string).collect() };
    let run = |args: &[&str], stdin: &str| ok(&with(args).iter().map(String::as_str).collect::<Vec<_>>(), stdin);
    let refused = |args: &[&str], stdin: &str| fails(&with(args).iter().map(String::as_str).collect::<Vec<_>>(), stdin);

    run(
        &["users", "add", "alice", "--mechanism", "SCRAM-SHA-512", "--mechanism", "SCRAM-SHA-256", "--password-stdin"],
        "s3cret\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let props = dir.path().join("bob.properties");
    std::fs::write(&props, "# Kafka client properties\nsasl.password=bob-pw\n").unwrap();
    run(&["users", "add", "bob", "--iterations", "8192", "--password-file", props.to_str().unwrap()], "");
    assert_eq!(run(&["users", "list"], ""), "alice\tSCRAM-SHA-256\t4096\nalice\tSCRAM-SHA-512\t4096\nbob\tSCRAM-SHA-256\t8192\n");
    assert!(refused(&["users", "add", "carol", "--password-stdin"], "").contains("empty password"));
    assert!(refused(&["users", "add", "carol", "--password-stdin", "--iterations", "10"], "pw\n").contains("iterations"));
    run(&["users", "delete", "alice", "--mechanism", "SCRAM-SHA-256"], "");
    assert!(refused(&["users", "delete", "nobody"], "").contains("no such credentials"));

    run(&["acls", "add", "--principal", "User:alice", "--operation", "Read", "--operation", "Describe", "--topic", "orders"], "");
    run(&["acls", "add", "--principal", "User:*", "--operation", "Write", "--topic", "pay", "--prefixed", "--deny"], "");
    run(&["acls", "add", "--principal", "User:bob", "--operation", "Alter", "--cluster"], "");
    assert!(refused(&["acls", "add", "--principal", "alice", "--operation", "Read", "--topic", "x"], "").contains("User:<name>"));
    assert_eq!(
        run(&["acls", "list", "--topic", "orders"], ""),
        "Allow User:alice Read from * on Topic:LITERAL:orders\nAllow User:alice Describe from * on Topic:LITERAL:orders\n"
    );
    assert_eq!(
        run(&["acls", "list", "--principal", "User:bob"], ""),
        "Allow User:bob Alter from * on Cluster:LITERAL:kafka-cluster\n"
    );
    assert_eq!(
        run(&["acls", "remove", "--topic", "orders", "--operation", "Read"], ""),
        "removed Allow User:alice Read from * on Topic:LITERAL:orders\n"
    );
    // Without --deny, remove only touches allow ACLs.
    assert!(refused(&["acls", "remove", "--topic", "pay", "--prefixed"], "").contains("no ACL matched"));
    assert_eq!(run(&["acls", "list"], "").lines().count(), 3);
}

/// What the tool stored, read back through the library.
async fn check_store(store: &dyn MetadataStore) {
    let alice = store::user_credentials(store, "alice").await.unwrap();
    assert_eq!(alice.keys().collect::<Vec<_>>(), [&ScramMechanism::Sha512]);
    assert!(alice[&ScramMechanism::Sha512].verify_password(ScramMechanism::Sha512, "s3cret"));
    let bob = store::credential(store, "bob", ScramMechanism::Sha256).await.unwrap().unwrap();
    assert_eq!(bob.iterations, 8192);
    assert!(bob.verify_password(ScramMechanism::Sha256, "bob-pw"));
    let authorizer = fjord_auth::Authorizer::new(
        fjord_auth::AuthorizerConfig::default(),
        store::read_acls(store).await.unwrap().into_iter().flat_map(|(pattern, entries)| {
            entries.into_iter().map(move |entry| fjord_auth::AclBinding { pattern: pattern.clone(), entry })
        }),
    );
    let alice = Principal::user("alice");
    assert!(authorizer.authorize(&alice, "10.0.0.1", Operation::Describe, Resource::topic("orders")));
    assert!(!authorizer.authorize(&alice, "10.0.0.1", Operation::Read, Resource::topic("orders")));
    assert!(authorizer.authorize(&Principal::user("bob"), "10.0.0.1", Operation::Alter, Resource::cluster()));
    let deny = &authorizer.acls().iter().find(|(p, _)| p.name == "pay").unwrap().1;
    assert!(deny.iter().all(|e| e.permission == Permission::Deny));
}

#[tokio::test]
async fn users_and_acls_on_a_stopped_brokers_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let data_dir = data.to_str().unwrap();
    tokio::task::spawn_blocking({
        let data_dir = data_dir.to_string();
        move || users_and_acls(&["--data-dir", &data_dir])
    })
    .await
    .unwrap();
    let metadata = data.join(fjord_broker::server::METADATA_DIR);
    let store = EmbeddedStore::open(&metadata).unwrap();
    check_store(&store).await;
    // While something (a broker) has the store open, the tool refuses instead of writing
    // into its journal behind its back.
    let err = fails(&["users", "list", "--data-dir", data_dir], "");
    assert!(err.contains("in use by another process"), "{err}");
    drop(store);
    assert!(fails(&["users", "list", "--data-dir", &format!("{data_dir}/missing")], "").contains("no data directory"));
    assert!(Path::new(&metadata).join("metadata.journal").exists());
}

#[tokio::test]
async fn users_and_acls_on_zookeeper() {
    let zk = fjord_testkit::ZooKeeper::start().unwrap();
    let connect = format!("{}/fjord-tools", zk.connect_string());
    tokio::task::spawn_blocking({
        let connect = connect.clone();
        move || users_and_acls(&["--zookeeper", &connect])
    })
    .await
    .unwrap();
    let store = ZooKeeperStore::connect(&connect, std::time::Duration::from_secs(6)).await.unwrap();
    check_store(&store).await;
}
