//! `fjord dev --secure` as a user meets it: the process makes `secure/ca.pem` and
//! `secure/admin.properties` under its data dir and serves SASL_SSL only, on loopback
//! only. The admin's file works as is with `fjord --command-config`, `kcat -F` and
//! confluent-kafka; a client without credentials (plaintext, or TLS without SASL) gets
//! nothing, and an authenticated user without ACLs cannot delete a topic, alter its
//! config, reset or delete a group, read or write records (Kafka's codes each time), and
//! afterwards the admin finds everything as it was. A restart reuses the files.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, wait_until_listening, FjordProcess};

/// confluent-kafka (librdkafka) with the admin's properties file as is: sets the stage as
/// the admin, then tries everything as `mallory`, an authenticated user without ACLs.
const SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Producer, Consumer, TopicPartition, KafkaException, ConsumerGroupTopicPartitions
from confluent_kafka.admin import (AdminClient, NewTopic, ConfigResource, ResourceType, ConfigEntry,
    AlterConfigOpType, UserScramCredentialUpsertion, ScramCredentialInfo, ScramMechanism)

admin_props = {}
for line in open(sys.argv[1]).read().splitlines():
    if line and not line.startswith('#'):
        key, value = line.split('=', 1)
        admin_props[key] = value
TOPIC_AUTH, GROUP_AUTH = 29, 30

def code(e):
    return e.args[0].code()

# The admin: a topic with 5 records, a group that committed offset 5.
a = AdminClient(admin_props)
a.create_topics([NewTopic('orders', 1, 1)])['orders'].result()
p = Producer(admin_props)
for i in range(5):
    p.produce('orders', value=b'order-%d' % i)
assert p.flush(30) == 0
c = Consumer(dict(admin_props, **{'group.id': 'billing', 'auto.offset.reset': 'earliest', 'enable.auto.commit': False}))
c.subscribe(['orders'])
seen = []
deadline = time.time() + 30
while len(seen) < 5 and time.time() < deadline:
    m = c.poll(1)
    if m is not None and not m.error():
        seen.append(m.value())
assert len(seen) == 5, seen
c.commit(asynchronous=False)
c.close()
a.alter_user_scram_credentials([UserScramCredentialUpsertion(
    'mallory', ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b'mallory-secret')])['mallory'].result()

# mallory: authenticated, no ACL.
m = dict(admin_props, **{'sasl.username': 'mallory', 'sasl.password': 'mallory-secret'})
ma = AdminClient(m)
try:
    ma.delete_topics(['orders'], operation_timeout=10)['orders'].result()
    raise AssertionError('mallory deleted a topic')
except KafkaException as e:
    assert code(e) == TOPIC_AUTH, e
res = ConfigResource(ResourceType.TOPIC, 'orders',
    incremental_configs=[ConfigEntry('retention.ms', '1', incremental_operation=AlterConfigOpType.SET)])
try:
    ma.incremental_alter_configs([res])[res].result()
    raise AssertionError('mallory altered a topic config')
except KafkaException as e:
    assert code(e) == TOPIC_AUTH, e
reset = ConsumerGroupTopicPartitions('billing', [TopicPartition('orders', 0, 0)])
try:
    ma.alter_consumer_group_offsets([reset])['billing'].result()
    raise AssertionError('mallory reset a group')
except KafkaException as e:
    assert code(e) == GROUP_AUTH, e
try:
    ma.delete_consumer_groups(['billing'], request_timeout=10)['billing'].result()
    raise AssertionError('mallory deleted a group')
except KafkaException as e:
    assert code(e) == GROUP_AUTH, e
mp = Producer(dict(m, **{'message.timeout.ms': 10000}))
errors = []
for topic in ['orders', '_audit', '__consumer_offsets']:
    mp.produce(topic, value=b'forged', on_delivery=lambda err, msg: errors.append(err))
mp.flush(30)
assert len(errors) == 3 and all(e is not None for e in errors), errors
mc = Consumer(dict(m, **{'group.id': 'billing', 'auto.offset.reset': 'earliest'}))
mc.assign([TopicPartition('orders', 0, 0)])
denied = None
deadline = time.time() + 20
while denied is None and time.time() < deadline:
    msg = mc.poll(1)
    if msg is None:
        continue
    assert msg.error(), 'mallory read a record: %r' % msg.value()
    denied = msg.error()
mc.close()
assert denied is not None and denied.code() in (TOPIC_AUTH, GROUP_AUTH), denied

# The admin finds everything as it was.
a.list_topics(timeout=10).topics['orders']
cfg = ConfigResource(ResourceType.TOPIC, 'orders')
assert a.describe_configs([cfg])[cfg].result()['retention.ms'].value != '1'
offsets = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions('billing')])['billing'].result()
assert [tp.offset for tp in offsets.topic_partitions] == [5], offsets
c = Consumer(dict(admin_props, **{'group.id': 'check', 'auto.offset.reset': 'earliest'}))
c.assign([TopicPartition('orders', 0, 0)])
seen = []
deadline = time.time() + 30
while len(seen) < 5 and time.time() < deadline:
    msg = c.poll(1)
    if msg is not None and not msg.error():
        seen.append(msg.value())
c.close()
assert seen == [b'order-%d' % i for i in range(5)], seen
print('ok')
"#;

fn fjord(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("FJORD_BOOTSTRAP")
        .env_remove("FJORD_SASL_PASSWORD")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `fjord dev --secure` on `port` with its data in `data`, once it listens and has written
/// `admin.properties`.
fn start(data: &Path, port: u16) -> FjordProcess {
    let mut dev = FjordProcess(
        Command::new(env!("CARGO_BIN_EXE_fjord"))
            .args(["dev", "--secure", "--data-dir"])
            .arg(data)
            .env("FJORD_LISTENERS", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until_listening(SocketAddr::from(([127, 0, 0, 1], port)), &mut dev);
    dev
}

/// The local addresses `pid` listens on (TCP), from `ss`.
fn listening(pid: u32) -> Vec<String> {
    let out = Command::new("ss").args(["-Hltnp"]).output().expect("ss (iproute2) must be installed");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_owned))
        .collect()
}

#[test]
fn dev_secure_serves_only_sasl_ssl_on_loopback_and_denies_without_credentials_or_acls() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("fjord-data");
    let port = free_port();
    let dev = start(&data, port);
    let props = data.join("secure/admin.properties");
    let ca = data.join("secure/ca.pem");
    assert!(ca.exists(), "no secure/ca.pem");
    let text = std::fs::read_to_string(&props).unwrap();
    for line in [
        format!("bootstrap.servers=127.0.0.1:{port}"),
        "security.protocol=SASL_SSL".into(),
        "sasl.mechanism=SCRAM-SHA-256".into(),
        "sasl.username=admin".into(),
        format!("ssl.ca.location={}", ca.display()),
    ] {
        assert!(text.lines().any(|l| l == line), "admin.properties lacks {line}:\n{text}");
    }
    let password = text.lines().find_map(|l| l.strip_prefix("sasl.password=")).unwrap().to_owned();
    assert!(password.len() >= 32, "a short password: {password}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&props).unwrap().permissions().mode() & 0o077, 0, "admin.properties is readable by others");

    // Loopback only, and only the one port (no registry, gateway or metrics in the clear).
    let bound = listening(dev.id());
    assert_eq!(bound, [format!("127.0.0.1:{port}")], "dev --secure listens on {bound:?}");

    // The admin's file as is: fjord, kcat -F, confluent-kafka.
    let config = props.to_str().unwrap();
    let out = fjord(&["topics", "create", "--topic", "audit-me", "--command-config", config]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new("kcat").args(["-F", config, "-L", "-t", "audit-me"]).output().unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && listing.contains("topic \"audit-me\""),
        "kcat -F: {listing}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let python = fjord_testkit::python().unwrap();
    let out = Command::new(&python).arg("-c").arg(SCRIPT).arg(config).output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "confluent-kafka:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // No credentials at all: plaintext, and TLS without SASL, get nothing (deleting,
    // altering, resetting, reading), and nothing changed.
    let addr = format!("127.0.0.1:{port}");
    let tls_only = dir.path().join("tls-only.properties");
    std::fs::write(&tls_only, format!("bootstrap.servers={addr}\nsecurity.protocol=SSL\nssl.ca.location={}\n", ca.display()))
        .unwrap();
    let tls_only = tls_only.to_str().unwrap();
    for connect in [["--bootstrap", addr.as_str()], ["--command-config", tls_only]] {
        let tries: [&[&str]; 4] = [
            &["topics", "delete", "orders"],
            &["topics", "alter", "orders", "--config", "retention.ms=1"],
            &["groups", "reset-offsets", "billing", "--topic", "orders", "--to-earliest"],
            &["consume", "--topic", "orders", "--from", "beginning", "--max-messages", "1"],
        ];
        for args in tries {
            let mut args = args.to_vec();
            args.extend(connect);
            args.extend(["--connect-timeout-ms", "2000"]);
            let started = Instant::now();
            let out = fjord(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "fjord {args:?} succeeded without credentials");
            // Refused by the broker, not by the command line.
            assert!(stderr.contains(&addr) && !stderr.contains("Usage:"), "fjord {args:?}: {stderr}");
            assert!(started.elapsed() < Duration::from_secs(30), "fjord {args:?} took {:?}", started.elapsed());
        }
    }
    let out = fjord(&["topics", "describe", "orders", "--command-config", config]);
    assert!(out.status.success(), "orders is gone: {}", String::from_utf8_lossy(&out.stderr));
    let out = fjord(&["consume", "--topic", "orders", "--from", "beginning", "--max-messages", "5", "--command-config", config]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 5, "{}", String::from_utf8_lossy(&out.stderr));
    drop(dev);

    // A restart reuses the CA and the admin's password.
    let ca_before = std::fs::read(&ca).unwrap();
    let dev = start(&data, port);
    assert_eq!(std::fs::read(&ca).unwrap(), ca_before, "the CA was made again");
    assert_eq!(std::fs::read_to_string(&props).unwrap(), text, "admin.properties changed");
    let out = fjord(&["topics", "list", "--command-config", config]);
    assert!(out.status.success(), "after a restart: {}", String::from_utf8_lossy(&out.stderr));
    drop(dev);
}
