//! The registry behind TLS and HTTP Basic, as Confluent's (`authentication.method=BASIC`),
//! with reads and writes authorized separately by ACLs on `Subject` resources (#19):
//! Confluent's Python `SchemaRegistryClient` with `basic.auth.user.info` over HTTPS gets
//! 401 without credentials, 403 when a reader registers, and works for the writer; its
//! Avro serializer and deserializer work under the same rules.

use std::net::SocketAddr;
use std::process::Command;

use fjord_auth::scram::{ScramCredential, ScramMechanism};
use fjord_auth::{AccessControlEntry, AclBinding, Operation, PatternType, Permission, Principal, ResourcePattern, ResourceType};
use fjord_schema_registry::RegistryConfig;
use fjord_testkit::Certs;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

fn allow(principal: &str, operation: Operation, prefix: &str) -> AclBinding {
    AclBinding {
        pattern: ResourcePattern::new(ResourceType::Subject, prefix, PatternType::Prefixed).unwrap(),
        entry: AccessControlEntry::new(Principal::user(principal), "*", operation, Permission::Allow).unwrap(),
    }
}

const SCRIPT: &str = r#"
import json, sys
from confluent_kafka.schema_registry import SchemaRegistryClient, Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroSerializer, AvroDeserializer
from confluent_kafka.serialization import SerializationContext, MessageField

url, ca = sys.argv[1], sys.argv[2]
def client(user_info=None):
    conf = {"url": url, "ssl.ca.location": ca}
    if user_info:
        conf["basic.auth.user.info"] = user_info
    return SchemaRegistryClient(conf)
def error_of(call):
    try:
        call()
        return "accepted"
    except SchemaRegistryError as e:
        return [e.http_status_code, e.error_code]

schema = Schema(json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}), "AVRO")
nobody, wrong = client(), client("writer:wrong")
reader, writer, admin = client("reader:reader-pw"), client("writer:writer-pw"), client("admin:admin-pw")
out = {}
out["anonymous"] = error_of(lambda: nobody.get_subjects())
out["wrong_password"] = error_of(lambda: wrong.get_subjects())
out["reader_registers"] = error_of(lambda: reader.register_schema("orders-value", schema))
out["writer_registers"] = writer.register_schema("orders-value", schema)
out["admin_registers_other"] = admin.register_schema("payments-value", schema)
out["reader_reads"] = reader.get_latest_version("orders-value").schema_id
out["reader_subjects"] = reader.get_subjects()
out["admin_subjects"] = admin.get_subjects()
out["reader_other"] = error_of(lambda: reader.get_latest_version("payments-value"))
out["reader_deletes"] = error_of(lambda: reader.delete_subject("orders-value"))
out["writer_sets_level"] = error_of(lambda: writer.set_compatibility("orders-value", "NONE"))
out["writer_sets_global"] = error_of(lambda: writer.set_compatibility(level="NONE"))
ser = AvroSerializer(writer, schema.schema_str)
payload = ser({"id": 42}, SerializationContext("orders", MessageField.VALUE))
out["decoded"] = AvroDeserializer(reader)(payload, SerializationContext("orders", MessageField.VALUE))
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_client_with_basic_auth_over_https_gets_401_403_and_200_by_the_acls() {
    let python = fjord_testkit::python().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("certs")).unwrap();
    let certs = Certs::create(&dir.path().join("certs")).unwrap();
    let store = fjord_coord::open(None, &dir.path().join("store")).await.unwrap();
    for (user, password) in [("admin", "admin-pw"), ("writer", "writer-pw"), ("reader", "reader-pw")] {
        let credential = ScramCredential::generate(ScramMechanism::Sha256, password, 4096).unwrap();
        fjord_auth::store::set_credential(&*store, user, ScramMechanism::Sha256, &credential).await.unwrap();
    }
    let acls = [allow("writer", Operation::Write, "orders-"), allow("reader", Operation::Describe, "orders-")];
    fjord_auth::store::create_acls(&*store, &acls).await.unwrap();

    let mut config = RegistryConfig::default();
    for (key, value) in [
        ("ssl.keystore.location", certs.path("server-keystore.pem")),
        ("authentication.method", "BASIC".into()),
        ("authentication.realm", "SchemaRegistry".into()),
        ("authorizer.enable", "true".into()),
        ("super.users", "User:admin".into()),
    ] {
        config.set(key, &value).unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(fjord_schema_registry::run(config, store, listener, shutdown.clone()));
    let url = format!("https://localhost:{}", addr.port());

    // Garbage instead of a ClientHello is dropped alone.
    garbage(addr).await;

    // curl: the 401 carries Confluent's error document and the Basic challenge.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--cacert", &certs.path("ca.pem"), "-D", "-"])
        .arg(format!("{url}/subjects"))
        .output()
        .expect("curl must be installed");
    let text = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(text.starts_with("http/2 401"), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("www-authenticate: basic realm=\"schemaregistry\""), "{text}");
    assert!(text.contains("\"error_code\":40101"), "{text}");

    let (ca, url_arg) = (certs.path("ca.pem"), url.clone());
    let output = tokio::task::spawn_blocking(move || Command::new(&python).arg("-c").arg(SCRIPT).arg(url_arg).arg(ca).output())
        .await
        .unwrap()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "python client failed:\n{stderr}");
    let line = String::from_utf8_lossy(&output.stdout);
    let out: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}\n{stderr}"));
    let expect = serde_json::json!({
        "anonymous": [401, 40101],
        "wrong_password": [401, 40101],
        "reader_registers": [403, 40301],
        "writer_registers": 1,
        "admin_registers_other": 1,
        "reader_reads": 1,
        "reader_subjects": ["orders-value"],
        "admin_subjects": ["orders-value", "payments-value"],
        "reader_other": [403, 40301],
        "reader_deletes": [403, 40301],
        "writer_sets_level": [403, 40301],
        "writer_sets_global": [403, 40301],
        "decoded": {"id": 42},
    });
    assert_eq!(out, expect);
    shutdown.cancel();
    server.await.unwrap().unwrap();
}

/// Sends bytes that are no TLS ClientHello and checks the connection is closed, in clear
/// with nothing.
async fn garbage(addr: SocketAddr) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"GET /subjects HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 512];
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut buf)).await.expect("closed promptly");
    if let Ok(n) = read {
        assert!(!buf[..n].starts_with(b"HTTP/"), "answered in clear");
    }
}
