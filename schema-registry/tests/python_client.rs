//! An independent client: Python `confluent-kafka`'s SchemaRegistryClient, AvroSerializer and
//! AvroDeserializer against a running Fjord registry. Python registers a schema and
//! serializes a record that Fjord's deserializer reads; Fjord serializes a record that
//! Python's deserializer reads.
//!
//! The interpreter is `$FJORD_TEST_PYTHON` (set by `cargo xtask test`), else the workspace's
//! `target/venv/bin/python` (created by `cargo xtask provision`). Without it the test fails
//! and says how to get it: it never skips.

mod support;

use std::path::PathBuf;
use std::process::Command;

use apache_avro::types::Value;
use fjord_schema_registry::RegistryClient;
use support::{embedded_store, Registry};

const SCHEMA: &str = r#"{"type":"record","name":"PageView","namespace":"fjord.test","fields":[
  {"name":"url","type":"string"},
  {"name":"count","type":"int"},
  {"name":"ms","type":"long"},
  {"name":"score","type":"double"},
  {"name":"ok","type":"boolean"},
  {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["VIEW","CLICK"]}},
  {"name":"tags","type":{"type":"array","items":"string"}},
  {"name":"attrs","type":{"type":"map","values":"long"}},
  {"name":"ref","type":["null","string"],"default":null},
  {"name":"geo","type":{"type":"record","name":"Geo","fields":[{"name":"country","type":"string"}]}}
]}"#;

/// Python side: serialize a record (auto-registering under `py-topic-value`), then
/// deserialize the Fjord-written payload given in hex; print both as one JSON line.
const SCRIPT: &str = r#"
import json, sys
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer, AvroDeserializer
from confluent_kafka.serialization import SerializationContext, MessageField

url, schema, fjord_payload = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
client = SchemaRegistryClient({"url": url})
record = {"url": "/py", "count": 7, "ms": 1700000000123, "score": 0.5, "ok": True, "kind": "CLICK",
          "tags": ["x", "y"], "attrs": {"k": 9}, "ref": "from-python", "geo": {"country": "NO"}}
ser = AvroSerializer(client, schema)
payload = ser(record, SerializationContext("py-topic", MessageField.VALUE))
de = AvroDeserializer(client)
decoded = de(fjord_payload, SerializationContext("rust-topic", MessageField.VALUE))
registered = client.get_latest_version("py-topic-value")
print(json.dumps({"payload": payload.hex(), "decoded": decoded, "registered_id": registered.schema_id}))
"#;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("FJORD_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/venv/bin/python")
}

fn page_view_from_rust() -> Value {
    Value::Record(vec![
        ("url".into(), Value::String("/rust".into())),
        ("count".into(), Value::Int(3)),
        ("ms".into(), Value::Long(42)),
        ("score".into(), Value::Double(1.25)),
        ("ok".into(), Value::Boolean(false)),
        ("kind".into(), Value::Enum(0, "VIEW".into())),
        ("tags".into(), Value::Array(vec![Value::String("r".into())])),
        ("attrs".into(), Value::Map([("n".to_string(), Value::Long(-1))].into_iter().collect())),
        ("ref".into(), Value::Union(0, Box::new(Value::Null))),
        ("geo".into(), Value::Record(vec![("country".into(), Value::String("SE".into()))])),
    ])
}

#[tokio::test]
async fn confluent_python_client_and_fjord_read_each_others_payloads() {
    let python = python();
    assert!(
        python.exists(),
        "Python venv with confluent-kafka not found at {} (set FJORD_TEST_PYTHON, or run `cargo xtask provision`, \
         which installs confluent-kafka[avro,schemaregistry] into target/venv)",
        python.display()
    );
    let (_dir, store) = embedded_store();
    let registry = Registry::start(store).await;
    let client = RegistryClient::new(&registry.url).unwrap();

    let fjord_payload = client.serialize("rust-topic-value", SCHEMA, page_view_from_rust()).await.unwrap();
    let hex: String = fjord_payload.iter().map(|b| format!("{b:02x}")).collect();
    let url = registry.url.clone();
    let python_for_task = python.clone();
    let output = tokio::task::spawn_blocking(move || Command::new(&python_for_task).arg("-c").arg(SCRIPT).arg(&url).arg(SCHEMA).arg(&hex).output())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", python.display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "python client failed ({}):\n{stderr}", output.status);
    let line = String::from_utf8_lossy(&output.stdout);
    let result: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}\n{stderr}"));

    // Python read what Fjord wrote.
    assert_eq!(
        result["decoded"],
        serde_json::json!({"url": "/rust", "count": 3, "ms": 42, "score": 1.25, "ok": false, "kind": "VIEW",
                           "tags": ["r"], "attrs": {"n": -1}, "ref": null, "geo": {"country": "SE"}})
    );

    // Fjord reads what Python wrote, with the id Python's registration got.
    let payload: Vec<u8> = (0..result["payload"].as_str().unwrap().len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&result["payload"].as_str().unwrap()[i..i + 2], 16).unwrap())
        .collect();
    let decoded = client.deserialize(&payload).await.unwrap();
    assert_eq!(i64::from(decoded.schema_id), result["registered_id"].as_i64().unwrap());
    // Same schema as Fjord registered under the other subject: same global id.
    assert_eq!(&payload[1..5], &fjord_payload[1..5]);
    assert_eq!(
        decoded.value,
        Value::Record(vec![
            ("url".into(), Value::String("/py".into())),
            ("count".into(), Value::Int(7)),
            ("ms".into(), Value::Long(1_700_000_000_123)),
            ("score".into(), Value::Double(0.5)),
            ("ok".into(), Value::Boolean(true)),
            ("kind".into(), Value::Enum(1, "CLICK".into())),
            ("tags".into(), Value::Array(vec![Value::String("x".into()), Value::String("y".into())])),
            ("attrs".into(), Value::Map([("k".to_string(), Value::Long(9))].into_iter().collect())),
            ("ref".into(), Value::Union(1, Box::new(Value::String("from-python".into())))),
            ("geo".into(), Value::Record(vec![("country".into(), Value::String("NO".into()))])),
        ])
    );
    registry.stop().await;
}
