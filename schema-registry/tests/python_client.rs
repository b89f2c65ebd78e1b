//! An independent client: Python `confluent-kafka`'s SchemaRegistryClient, AvroSerializer and
//! AvroDeserializer against a running Fjord registry. Python registers a schema and
//! serializes a record that Fjord's deserializer reads; Fjord serializes a record that
//! Python's deserializer reads.
//!
//! The interpreter is `$FJORD_TEST_PYTHON` (set by `cargo xtask test`), else the workspace's
//! `target/venv/bin/python` (created by `cargo xtask provision`). Without it the test fails
//! and says how to get it: it never skips.

mod support;

use std::process::Command;

use apache_avro::types::Value;
use fjord_schema_registry::RegistryClient;
use serde_json::json;
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

/// Python side: serialize a record (auto-registering under `py-topic-value`), deserialize
/// the Fjord-written payload given in hex, then drive the rest of the API through the
/// client's own methods (which parse our responses their way); print one JSON line.
const SCRIPT: &str = r#"
import json, sys
from confluent_kafka.schema_registry import SchemaRegistryClient, Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError
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
out = {"payload": payload.hex(), "decoded": decoded, "registered_id": registered.schema_id}

def error_of(call):
    try:
        call()
        return "accepted"
    except SchemaRegistryError as e:
        return [e.http_status_code, e.error_code]

subject = "py-topic-value"
evolved = json.loads(schema)
evolved["fields"].append({"name": "extra", "type": "string", "default": ""})
incompatible = json.loads(schema)
incompatible["fields"][0]["type"] = "int"
evolved, incompatible = Schema(json.dumps(evolved), "AVRO"), Schema(json.dumps(incompatible), "AVRO")
out["subjects"] = client.get_subjects()
out["prefixed"] = client.get_subjects(subject_prefix="py-")
out["versions"] = client.get_versions(subject)
v = client.get_version(subject, 1)
out["version"] = [v.schema_id, v.subject, v.version]
looked = client.lookup_schema(subject, Schema(schema, "AVRO"))
out["lookup"] = [looked.schema_id, looked.version]
out["compatible"] = client.test_compatibility(subject, evolved)
out["incompatible"] = client.test_compatibility(subject, incompatible)
out["set_level"] = client.set_compatibility(subject, "FULL")
out["get_level"] = client.get_compatibility(subject)
out["global_level"] = client.get_compatibility()
out["register_incompatible"] = error_of(lambda: client.register_schema(subject, incompatible))
out["evolved_id"] = client.register_schema(subject, evolved)
out["unknown_id"] = error_of(lambda: client.get_schema(999999))
out["unknown_subject"] = error_of(lambda: client.get_versions("nope"))
out["deleted"] = client.delete_subject(subject)
out["deleted_permanent"] = client.delete_subject(subject, permanent=True)
out["subjects_after"] = client.get_subjects()
print(json.dumps(out))
"#;

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
    let python = fjord_testkit::python().unwrap();
    let (_dir, store) = embedded_store();
    let registry = Registry::start(store).await;
    let client = RegistryClient::new(&registry.url).unwrap();

    let fjord_payload = client.serialize("rust-topic-value", SCHEMA, page_view_from_rust()).await.unwrap();
    let hex: String = fjord_payload.iter().map(|b| format!("{b:02x}")).collect();
    let url = registry.url.clone();
    let python_for_task = python.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(&python_for_task).arg("-c").arg(SCRIPT).arg(&url).arg(SCHEMA).arg(&hex).output()
    })
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
        json!({"url": "/rust", "count": 3, "ms": 42, "score": 1.25, "ok": false, "kind": "VIEW",
                           "tags": ["r"], "attrs": {"n": -1}, "ref": null, "geo": {"country": "SE"}})
    );

    // The rest of the API as the Confluent client sees it.
    let expect = [
        ("subjects", json!(["py-topic-value", "rust-topic-value"])),
        ("prefixed", json!(["py-topic-value"])),
        ("versions", json!([1])),
        ("version", json!([1, "py-topic-value", 1])),
        ("lookup", json!([1, 1])),
        ("compatible", json!(true)),
        ("incompatible", json!(false)),
        // The client hands back the PUT /config response document as it is.
        ("set_level", json!({"compatibility": "FULL"})),
        ("get_level", json!("FULL")),
        ("global_level", json!("BACKWARD")),
        ("register_incompatible", json!([409, 409])),
        ("evolved_id", json!(2)),
        ("unknown_id", json!([404, 40403])),
        ("unknown_subject", json!([404, 40401])),
        ("deleted", json!([1, 2])),
        ("deleted_permanent", json!([1, 2])),
        ("subjects_after", json!(["rust-topic-value"])),
    ];
    for (key, want) in expect {
        assert_eq!(result[key], want, "{key}: {result}");
    }

    // Fjord reads what Python wrote, with the id Python's registration got (and after the
    // subject's permanent deletion: ids stay, so written data stays readable).
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
