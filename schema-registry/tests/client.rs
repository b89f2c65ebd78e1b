//! The Rust client and the Confluent framing against a running registry.

mod support;

use apache_avro::types::Value;
use apache_avro::Schema;
use fjord_schema_registry::{Error, RegistryClient};
use support::{embedded_store, record, Registry};

fn click_schema() -> String {
    record(
        r#"{"name":"url","type":"string"},{"name":"ms","type":"long"},
           {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["VIEW","CLICK"]}},
           {"name":"tags","type":{"type":"array","items":"string"}},
           {"name":"ref","type":["null","string"],"default":null}"#,
    )
}

fn click(url: &str) -> Value {
    Value::Record(vec![
        ("url".into(), Value::String(url.into())),
        ("ms".into(), Value::Long(1_700_000_000_000)),
        ("kind".into(), Value::Enum(1, "CLICK".into())),
        ("tags".into(), Value::Array(vec![Value::String("a".into()), Value::String("b".into())])),
        ("ref".into(), Value::Union(0, Box::new(Value::Null))),
    ])
}

#[tokio::test]
async fn serialize_deserialize_round_trip_with_cache_and_typed_framing_errors() {
    let (_dir, store) = embedded_store();
    let registry = Registry::start(store).await;
    let client = RegistryClient::new(&registry.url).unwrap();

    let payload = client.serialize("clicks-value", &click_schema(), click("/home")).await.unwrap();
    assert_eq!(payload[0], 0, "magic byte");
    assert_eq!(&payload[1..5], &1i32.to_be_bytes(), "schema id 1, big-endian");
    let decoded = client.deserialize(&payload).await.unwrap();
    assert_eq!(decoded.schema_id, 1);
    assert_eq!(decoded.value, click("/home"));

    // A value built from JSON is resolved against the schema before encoding.
    let from_json = Value::try_from(serde_json::json!({
        "url": "/j", "ms": 5, "kind": "VIEW", "tags": [], "ref": "x"
    }))
    .unwrap();
    let payload2 = client.serialize_with_id(1, from_json).await.unwrap();
    let decoded2 = client.deserialize(&payload2).await.unwrap().value;
    let Value::Record(fields) = decoded2 else { panic!("not a record: {decoded2:?}") };
    assert_eq!(fields[0].1, Value::String("/j".into()));
    assert_eq!(fields[2].1, Value::Enum(0, "VIEW".into()));
    assert_eq!(fields[4].1, Value::Union(1, Box::new(Value::String("x".into()))));

    // A value that does not fit the schema is a typed Avro error, not a panic.
    let wrong = Value::Record(vec![("url".into(), Value::Int(3))]);
    assert!(matches!(client.serialize("clicks-value", &click_schema(), wrong).await, Err(Error::Avro(_))));

    // Schema evolution on read: a reader with an extra defaulted field.
    let reader =
        Schema::parse_str(&record(r#"{"name":"url","type":"string"},{"name":"country","type":"string","default":"NO"}"#))
            .unwrap();
    let evolved = client.deserialize_as(&payload, &reader).await.unwrap().value;
    assert_eq!(
        evolved,
        Value::Record(vec![("url".into(), Value::String("/home".into())), ("country".into(), Value::String("NO".into()))])
    );

    // Bad framing: typed errors.
    assert!(matches!(client.deserialize(&payload[..3]).await, Err(Error::ShortPayload { len: 3 })));
    let mut bad_magic = payload.clone();
    bad_magic[0] = 1;
    assert!(matches!(client.deserialize(&bad_magic).await, Err(Error::BadMagic(1))));
    let mut unknown = payload.clone();
    unknown[1..5].copy_from_slice(&4242i32.to_be_bytes());
    assert!(matches!(client.deserialize(&unknown).await, Err(Error::UnknownId(4242))));
    let mut trailing = payload.clone();
    trailing.push(0);
    assert!(matches!(client.deserialize(&trailing).await, Err(Error::TrailingBytes { schema_id: 1, len: 1 })));
    let truncated = &payload[..payload.len() - 2];
    assert!(matches!(client.deserialize(truncated).await, Err(Error::BadDatum { .. })));

    // Registry errors come back typed with Confluent's code.
    let incompatible = record(r#"{"name":"url","type":"int"}"#);
    match client.register("clicks-value", &incompatible).await {
        Err(Error::Registry { status: 409, error_code: 409, message }) => assert!(message.contains("TYPE_MISMATCH"), "{message}"),
        other => panic!("expected a 409, got {other:?}"),
    }

    // The id → schema cache: with the registry gone, known ids still decode.
    registry.stop().await;
    // A port nothing listens on: bound, then released.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let fresh = RegistryClient::new(&format!("http://{closed}")).unwrap();
    assert!(matches!(fresh.deserialize(&payload).await, Err(Error::Http { .. })), "an uncached id needs the registry");
    assert_eq!(client.deserialize(&payload).await.unwrap().value, click("/home"));
}
