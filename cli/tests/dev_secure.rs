//! `fjord dev --secure` as a user meets it: the process makes `secure/ca.pem` and
//! `secure/admin.properties` under its data dir and serves SASL_SSL only, on loopback
//! only. The admin's file works as is with `fjord --command-config`, `kcat -F` and
//! confluent-kafka; a client without credentials (plaintext, or TLS without SASL) gets
//! nothing, and an authenticated user without ACLs cannot delete a topic, alter its
//! config, reset or delete a group, read or write records (Kafka's codes each time), and
//! afterwards the admin finds everything as it was. The registry and the gateway serve
//! HTTPS with the same CA and users: 401 without credentials, 403 without ACLs, for
//! pulling records, reading and deleting a subject; the gateway validates Avro records
//! against the registry's schemas, read over HTTPS as its own user, as a broker user
//! that is not a super user. The broker's metrics endpoint is HTTPS with Basic too. A
//! restart reuses the files.

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

/// The ports of the services: broker, registry, gateway HTTP, gateway gRPC, metrics.
#[derive(Clone, Copy)]
struct Ports {
    broker: u16,
    registry: u16,
    http: u16,
    grpc: u16,
    metrics: u16,
}

/// `fjord dev --secure` with its data in `data`, once every service listens.
fn start(data: &Path, p: Ports) -> FjordProcess {
    let at = |port: u16| format!("127.0.0.1:{port}");
    let mut dev = FjordProcess(
        Command::new(env!("CARGO_BIN_EXE_fjord"))
            .args(["dev", "--secure", "--data-dir"])
            .arg(data)
            .args(["--registry", &at(p.registry), "--http", &at(p.http), "--grpc", &at(p.grpc), "--metrics", &at(p.metrics)])
            .env("FJORD_LISTENERS", at(p.broker))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    for port in [p.broker, p.registry, p.http, p.grpc, p.metrics] {
        wait_until_listening(SocketAddr::from(([127, 0, 0, 1], port)), &mut dev);
    }
    // Written once the store is open, just after the services bound their ports.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !data.join("secure/admin.properties").exists() {
        assert!(Instant::now() < deadline, "no secure/admin.properties");
        std::thread::sleep(Duration::from_millis(50));
    }
    dev
}

/// `curl` with `args`: (HTTP status, body).
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl").args(["-s", "-o", "-", "-w", "\n%{http_code}"]).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_owned())
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
    let ports = Ports { broker: free_port(), registry: free_port(), http: free_port(), grpc: free_port(), metrics: free_port() };
    let port = ports.broker;
    let dev = start(&data, ports);
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

    // Loopback only: the services and the broker's metrics endpoint.
    let mut bound = listening(dev.id());
    bound.sort();
    let mut expected: Vec<String> =
        [ports.broker, ports.registry, ports.http, ports.grpc, ports.metrics].iter().map(|p| format!("127.0.0.1:{p}")).collect();
    expected.sort();
    assert_eq!(bound, expected, "dev --secure listens on {bound:?}");

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
    // The registry and the gateway: HTTPS with the same CA, Basic with the same users, the
    // same ACLs (mallory exists now, with no ACL).
    let ca_arg = ca.to_str().unwrap();
    let admin_user = format!("admin:{password}");
    let registry = format!("https://127.0.0.1:{}", ports.registry);
    let gateway = format!("https://127.0.0.1:{}", ports.http);
    let schema = r#"{"schema":"{\"type\":\"string\"}"}"#;
    let post = ["-X", "POST", "-H", "Content-Type: application/vnd.schemaregistry.v1+json", "--data", schema];
    let subject = format!("{registry}/subjects/orders-value/versions");
    let mut args = vec!["--cacert", ca_arg, "-u", &admin_user];
    args.extend(post);
    args.push(&subject);
    let (status, body) = curl(&args);
    assert_eq!(status, 200, "the admin could not register a schema: {body}");
    let id: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = id["id"].as_i64().unwrap();
    // The gateway validates Avro against that schema, which it reads from the registry
    // over HTTPS as its own user: a string is produced, a number refused.
    let produce = format!("{gateway}/topics/orders");
    for (value, expected) in [(r#""order-avro""#, 200), ("5", 422)] {
        let record = format!(r#"{{"value_schema_id":{id},"records":[{{"value":{value}}}]}}"#);
        let avro = ["-X", "POST", "-H", "Content-Type: application/vnd.kafka.avro.v2+json", "--data", &record];
        let mut args = vec!["--cacert", ca_arg, "-u", &admin_user];
        args.extend(avro);
        args.push(&produce);
        let (status, body) = curl(&args);
        assert_eq!(status, expected, "Avro value {value} through the gateway: {body}");
    }
    // The gateway's broker identity is not a super user, only what its ACLs allow: it
    // still publishes (above; and with an Idempotency-Key, kept in the topic it creates,
    // `_gateway_idempotency`), but a client with its credentials can neither delete a
    // topic nor change its config.
    let keyed = ["-X", "POST", "-H", "Content-Type: application/x-ndjson", "-H", "Idempotency-Key: once"];
    let event = format!("{gateway}/v1/events/orders");
    for _ in 0..2 {
        let mut args = vec!["--cacert", ca_arg, "-u", &admin_user];
        args.extend(keyed);
        args.extend(["--data-binary", "{\"order\":\"keyed\"}\n", &event]);
        let (status, body) = curl(&args);
        assert_eq!(status, 200, "a keyed publish through the gateway: {body}");
    }
    let gateway_password = std::fs::read_to_string(data.join("secure/gateway.properties")).unwrap();
    let gateway_password = gateway_password.lines().find_map(|l| l.strip_prefix("sasl.password=")).unwrap();
    let as_gateway = dir.path().join("as-gateway.properties");
    let gateway_text = text
        .replace("sasl.username=admin", "sasl.username=gateway")
        .replace(&format!("sasl.password={password}"), &format!("sasl.password={gateway_password}"));
    std::fs::write(&as_gateway, gateway_text).unwrap();
    let as_gateway = as_gateway.to_str().unwrap();
    let tries: [&[&str]; 2] = [&["topics", "delete", "orders"], &["topics", "alter", "orders", "--config", "retention.ms=1"]];
    for args in tries {
        let mut args = args.to_vec();
        args.extend(["--command-config", as_gateway]);
        let out = fjord(&args);
        let stderr = String::from_utf8_lossy(&out.stderr).to_lowercase();
        assert!(!out.status.success() && stderr.contains("authoriz"), "as the gateway, fjord {args:?}: {stderr}");
    }
    let pull = format!("{gateway}/v1/topics/orders/partitions/0/records?offset=0&format=binary");
    let delete = format!("{registry}/subjects/orders-value?permanent=false");
    for (who, auth, status) in [("nobody", None, 401), ("mallory", Some("mallory:mallory-secret"), 403)] {
        let mut base = vec!["--cacert", ca_arg];
        if let Some(auth) = auth {
            base.extend(["-u", auth]);
        }
        let tries: [Vec<&str>; 3] = [vec![pull.as_str()], vec!["-X", "DELETE", delete.as_str()], vec![subject.as_str()]];
        for extra in tries {
            let mut args = base.clone();
            args.extend(extra);
            let (got, body) = curl(&args);
            assert_eq!(got, status, "{who}: curl {args:?} answered {body}");
        }
    }
    // The broker's metrics: HTTPS only, Basic with the same users.
    let metrics = format!("https://127.0.0.1:{}/metrics", ports.metrics);
    assert_eq!(curl(&["--cacert", ca_arg, &metrics]).0, 401, "metrics without credentials");
    assert_eq!(curl(&["--cacert", ca_arg, "-u", "admin:not-the-password", &metrics]).0, 401, "metrics with a wrong password");
    let (status, body) = curl(&["--cacert", ca_arg, "-u", &admin_user, &metrics]);
    assert!(status == 200 && body.contains("fjord_broker_requests_total"), "the admin's scrape: {status} {body}");
    assert_eq!(curl(&["--cacert", ca_arg, "-u", "mallory:mallory-secret", &metrics]).0, 200, "any user may scrape");
    assert_eq!(curl(&["-u", &admin_user, &metrics.replace("https", "http")]).0, 0, "plain HTTP on the metrics port");
    // Plain HTTP on the HTTPS ports gets no answer.
    assert_ne!(curl(&[&pull.replace("https", "http")]).0, 200);
    let (status, body) = curl(&["--cacert", ca_arg, "-u", &admin_user, &pull]);
    assert!(status == 200 && body.contains("b3JkZXItMA"), "the admin's pull: {status} {body}");
    let (status, body) = curl(&["--cacert", ca_arg, "-u", &admin_user, &format!("{registry}/subjects")]);
    assert!(status == 200 && body.contains("orders-value"), "the subject is gone: {status} {body}");

    let out = fjord(&["topics", "describe", "orders", "--command-config", config]);
    assert!(out.status.success(), "orders is gone: {}", String::from_utf8_lossy(&out.stderr));
    let out = fjord(&["consume", "--topic", "orders", "--from", "beginning", "--max-messages", "5", "--command-config", config]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 5, "{}", String::from_utf8_lossy(&out.stderr));
    drop(dev);

    // A restart reuses the CA and the admin's password.
    let ca_before = std::fs::read(&ca).unwrap();
    let dev = start(&data, ports);
    assert_eq!(std::fs::read(&ca).unwrap(), ca_before, "the CA was made again");
    assert_eq!(std::fs::read_to_string(&props).unwrap(), text, "admin.properties changed");
    let out = fjord(&["topics", "list", "--command-config", config]);
    assert!(out.status.success(), "after a restart: {}", String::from_utf8_lossy(&out.stderr));
    drop(dev);
}
