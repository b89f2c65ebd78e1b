//! JSON → Avro for the Avro content types: a value arrives as JSON (Avro's JSON encoding:
//! unions as `{"type": value}` or, leniently, a bare value that fits one branch) and leaves
//! as the Confluent framing (magic 0, 4-byte schema id, Avro binary).
//!
//! The conversion walks the schema itself rather than handing the JSON to apache-avro's
//! resolver, so a mismatch names the field path (`$.address.zip`), which is what a
//! caller needs to fix the event.

use apache_avro::schema::{DecimalSchema, InnerDecimalSchema, Name, NamesRef, ResolvedSchema};
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;
use base64::Engine;
use serde_json::Value as Json;

use crate::{Error, Result};

/// The largest `fixed` the registry accepts by default ([`fjord_schema_registry::SchemaLimits`]).
const MAX_FIXED_SIZE: usize = 1024 * 1024;

/// A mismatch: where, and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mismatch {
    pub(crate) path: String,
    pub(crate) reason: String,
}

/// Converts `json` to an Avro datum of `schema` and frames it with `schema_id`.
/// `index` is the record's place in the request, for the error.
pub(crate) fn encode(schema_id: i32, schema: &Schema, json: &Json, index: usize) -> Result<Vec<u8>> {
    let resolved = ResolvedSchema::new(schema)
        .map_err(|e| Error::Unprocessable { index: Some(index), reason: format!("schema {schema_id}: {e}") })?;
    let mismatch = |m: Mismatch| Error::AvroMismatch { index, schema_id, path: m.path, reason: m.reason };
    let value = to_avro(json, schema, resolved.get_names(), &mut "$".to_string()).map_err(mismatch)?;
    let datum = GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .map_err(|e| mismatch(Mismatch { path: "$".into(), reason: e.to_string() }))?;
    Ok(fjord_schema_registry::framing::frame(schema_id, &datum))
}

fn fail<T>(path: &str, reason: impl Into<String>) -> Result<T, Mismatch> {
    Err(Mismatch { path: path.to_string(), reason: reason.into() })
}

fn kind(json: &Json) -> &'static str {
    match json {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// The name a union branch goes by in Avro's JSON encoding.
fn branch_name(schema: &Schema) -> String {
    match schema {
        Schema::Null => "null".into(),
        Schema::Boolean => "boolean".into(),
        Schema::Int | Schema::Date | Schema::TimeMillis => "int".into(),
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => "long".into(),
        Schema::Float => "float".into(),
        Schema::Double => "double".into(),
        Schema::Bytes | Schema::BigDecimal => "bytes".into(),
        Schema::String | Schema::Uuid(_) => "string".into(),
        Schema::Array(_) => "array".into(),
        Schema::Map(_) => "map".into(),
        Schema::Record(r) => r.name.fullname(None),
        Schema::Enum(e) => e.name.fullname(None),
        Schema::Fixed(f) | Schema::Duration(f) => f.name.fullname(None),
        Schema::Decimal(_) => "bytes".into(),
        Schema::Ref { name } => name.fullname(None),
        Schema::Union(_) => "union".into(),
    }
}

fn lookup<'s>(names: &NamesRef<'s>, name: &Name, path: &str) -> Result<&'s Schema, Mismatch> {
    match names.get(name) {
        Some(s) => Ok(s),
        None => fail(path, format!("schema references unknown type {}", name.fullname(None))),
    }
}

fn int(json: &Json, path: &str) -> Result<i32, Mismatch> {
    match json.as_i64().map(i32::try_from) {
        Some(Ok(v)) => Ok(v),
        Some(Err(_)) => fail(path, format!("{json} does not fit an int")),
        None => fail(path, format!("expected an int, got {}", kind(json))),
    }
}

fn long(json: &Json, path: &str) -> Result<i64, Mismatch> {
    json.as_i64().map_or_else(|| fail(path, format!("expected a long, got {}", kind(json))), Ok)
}

/// Avro's JSON encoding of bytes and fixed: a string whose code points 0..=255 are the bytes.
fn byte_string(json: &Json, path: &str) -> Result<Vec<u8>, Mismatch> {
    let Json::String(s) = json else {
        return fail(path, format!("expected bytes as a string, got {}", kind(json)));
    };
    s.chars()
        .map(|c| {
            u8::try_from(u32::from(c)).map_err(|_| Mismatch {
                path: path.into(),
                reason: format!("character {c:?} is not a byte (use code points 0-255)"),
            })
        })
        .collect()
}

fn to_avro(json: &Json, schema: &Schema, names: &NamesRef<'_>, path: &mut String) -> Result<Value, Mismatch> {
    Ok(match schema {
        Schema::Null => match json {
            Json::Null => Value::Null,
            _ => return fail(path, format!("expected null, got {}", kind(json))),
        },
        Schema::Boolean => match json {
            Json::Bool(b) => Value::Boolean(*b),
            _ => return fail(path, format!("expected a boolean, got {}", kind(json))),
        },
        Schema::Int => Value::Int(int(json, path)?),
        Schema::Long => Value::Long(long(json, path)?),
        Schema::Float => match json.as_f64() {
            Some(v) => Value::Float(v as f32),
            None => return fail(path, format!("expected a float, got {}", kind(json))),
        },
        Schema::Double => match json.as_f64() {
            Some(v) => Value::Double(v),
            None => return fail(path, format!("expected a double, got {}", kind(json))),
        },
        Schema::String => match json {
            Json::String(s) => Value::String(s.clone()),
            _ => return fail(path, format!("expected a string, got {}", kind(json))),
        },
        Schema::Bytes => Value::Bytes(byte_string(json, path)?),
        Schema::Fixed(f) => {
            let bytes = byte_string(json, path)?;
            if bytes.len() != f.size {
                return fail(path, format!("fixed {} needs {} bytes, got {}", f.name.fullname(None), f.size, bytes.len()));
            }
            Value::Fixed(f.size, bytes)
        }
        Schema::Enum(e) => match json {
            Json::String(s) => match e.symbols.iter().position(|x| x == s) {
                Some(i) => Value::Enum(i as u32, s.clone()),
                None => {
                    return fail(
                        path,
                        format!("{s:?} is not a symbol of enum {} ({})", e.name.fullname(None), e.symbols.join(", ")),
                    )
                }
            },
            _ => return fail(path, format!("expected an enum symbol string, got {}", kind(json))),
        },
        Schema::Array(a) => {
            let Json::Array(items) = json else {
                return fail(path, format!("expected an array, got {}", kind(json)));
            };
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                out.push(to_avro(item, &a.items, names, path)?);
                path.truncate(len);
            }
            Value::Array(out)
        }
        Schema::Map(m) => {
            let Json::Object(entries) = json else {
                return fail(path, format!("expected an object (map), got {}", kind(json)));
            };
            let mut out = std::collections::HashMap::with_capacity(entries.len());
            for (k, v) in entries {
                let len = path.len();
                path.push_str(&format!("[{k:?}]"));
                out.insert(k.clone(), to_avro(v, &m.types, names, path)?);
                path.truncate(len);
            }
            Value::Map(out)
        }
        Schema::Record(r) => {
            let Json::Object(fields) = json else {
                return fail(path, format!("expected an object (record {}), got {}", r.name.fullname(None), kind(json)));
            };
            if let Some(unknown) = fields.keys().find(|k| !r.lookup.contains_key(*k)) {
                return fail(path, format!("record {} has no field {unknown:?}", r.name.fullname(None)));
            }
            let mut out = Vec::with_capacity(r.fields.len());
            for field in &r.fields {
                let len = path.len();
                path.push('.');
                path.push_str(&field.name);
                let value = match (fields.get(&field.name), &field.default) {
                    (Some(v), _) => to_avro(v, &field.schema, names, path)?,
                    (None, Some(default)) => to_avro(default, &field.schema, names, path)?,
                    (None, None) => return fail(path, "required field is missing (it has no default)"),
                };
                path.truncate(len);
                out.push((field.name.clone(), value));
            }
            Value::Record(out)
        }
        Schema::Union(u) => union(json, u.variants(), names, path)?,
        Schema::Ref { name } => to_avro(json, lookup(names, name, path)?, names, path)?,
        Schema::Date => Value::Date(int(json, path)?),
        Schema::TimeMillis => Value::TimeMillis(int(json, path)?),
        Schema::TimeMicros => Value::TimeMicros(long(json, path)?),
        Schema::TimestampMillis => Value::TimestampMillis(long(json, path)?),
        Schema::TimestampMicros => Value::TimestampMicros(long(json, path)?),
        Schema::TimestampNanos => Value::TimestampNanos(long(json, path)?),
        Schema::LocalTimestampMillis => Value::LocalTimestampMillis(long(json, path)?),
        Schema::LocalTimestampMicros => Value::LocalTimestampMicros(long(json, path)?),
        Schema::LocalTimestampNanos => Value::LocalTimestampNanos(long(json, path)?),
        // A decimal on a fixed is written sign-extended to the whole size, and apache-avro
        // sizes its precision check in i32 arithmetic: a size the registry would refuse
        // (schemas come through the registry client, which refuses them too) is refused here
        // before apache-avro allocates it or overflows on it.
        Schema::Decimal(DecimalSchema { inner: InnerDecimalSchema::Fixed(f), .. }) if f.size > MAX_FIXED_SIZE => {
            return fail(
                path,
                format!("decimal fixed {} of {} bytes is over the limit of {MAX_FIXED_SIZE}", f.name.fullname(None), f.size),
            )
        }
        // The remaining logical types (uuid, decimal, duration) have string or byte
        // encodings that apache-avro's own resolver knows; only the path is ours.
        other => match Value::try_from(json.clone()).and_then(|v| v.resolve(other)) {
            Ok(v) => v,
            Err(e) => return fail(path, e.to_string()),
        },
    })
}

fn union<'s>(json: &Json, variants: &'s [Schema], names: &NamesRef<'s>, path: &mut String) -> Result<Value, Mismatch> {
    if json.is_null() {
        return match variants.iter().position(|v| matches!(v, Schema::Null)) {
            Some(i) => Ok(Value::Union(i as u32, Box::new(Value::Null))),
            None => fail(path, "null is not allowed here (the union has no null branch)"),
        };
    }
    // Avro's JSON encoding: {"branch name": value}.
    if let Json::Object(o) = json {
        if o.len() == 1 {
            let (name, inner) = o.iter().next().expect("one entry");
            let resolve = |s: &'s Schema| match s {
                Schema::Ref { name } => names.get(name).copied(),
                s => Some(s),
            };
            let hit = variants.iter().enumerate().find(|(_, v)| {
                let n = branch_name(v);
                n == *name || n.rsplit('.').next() == Some(name.as_str())
            });
            if let Some((i, v)) = hit {
                let len = path.len();
                path.push_str(&format!("<{name}>"));
                let target = resolve(v).ok_or_else(|| Mismatch { path: path.clone(), reason: format!("unknown type {name}") })?;
                let value = to_avro(inner, target, names, path)?;
                path.truncate(len);
                return Ok(Value::Union(i as u32, Box::new(value)));
            }
        }
    }
    // Lenient: a bare value taken by the first branch it fits.
    for (i, v) in variants.iter().enumerate() {
        if matches!(v, Schema::Null) {
            continue;
        }
        if let Ok(value) = to_avro(json, v, names, &mut path.clone()) {
            return Ok(Value::Union(i as u32, Box::new(value)));
        }
    }
    let branches: Vec<String> = variants.iter().map(branch_name).collect();
    fail(path, format!("{} fits no branch of the union [{}]", kind(json), branches.join(", ")))
}

/// Decodes the base64 of the binary embedded format.
pub(crate) fn base64_decode(s: &str) -> std::result::Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| format!("invalid base64: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::parse_str(
            r#"{"type":"record","name":"Click","namespace":"t","fields":[
                {"name":"url","type":"string"},
                {"name":"ms","type":"long"},
                {"name":"ref","type":["null","string"],"default":null},
                {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["VIEW","BUY"]},"default":"VIEW"},
                {"name":"addr","type":{"type":"record","name":"Addr","fields":[{"name":"zip","type":"int"}]}},
                {"name":"prev","type":["null","Addr"],"default":null},
                {"name":"tags","type":{"type":"array","items":"string"},"default":[]}
            ]}"#,
        )
        .unwrap()
    }

    fn err(json: Json) -> (String, String) {
        match encode(7, &schema(), &json, 2) {
            Err(Error::AvroMismatch { index: 2, schema_id: 7, path, reason }) => (path, reason),
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }

    #[test]
    fn encodes_json_and_decodes_back_identically() {
        let s = schema();
        let json = json!({"url":"/a","ms":5,"ref":{"string":"x"},"kind":"BUY","addr":{"zip":1234},"prev":{"t.Addr":{"zip":1}},"tags":["a"]});
        let framed = encode(7, &s, &json, 0).unwrap();
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 7]);
        let mut datum = &framed[5..];
        let back = apache_avro::reader::datum::GenericDatumReader::builder(&s).build().unwrap().read_value(&mut datum).unwrap();
        let Value::Record(fields) = back else { panic!() };
        assert_eq!(fields[0], ("url".into(), Value::String("/a".into())));
        assert_eq!(fields[2], ("ref".into(), Value::Union(1, Box::new(Value::String("x".into())))));
        assert_eq!(fields[3], ("kind".into(), Value::Enum(1, "BUY".into())));
        assert!(datum.is_empty());
        // Defaults fill omitted fields; a bare value fits a union leniently.
        encode(7, &s, &json!({"url":"/a","ms":5,"ref":"bare","addr":{"zip":1}}), 0).unwrap();
    }

    #[test]
    fn mismatches_name_the_field_path() {
        assert_eq!(err(json!({"url":"/a","ms":5,"addr":{"zip":"x"}})).0, "$.addr.zip");
        let (path, reason) = err(json!({"url":"/a","ms":5,"addr":{}}));
        assert_eq!((path.as_str(), reason.contains("missing")), ("$.addr.zip", true));
        assert_eq!(err(json!({"url":"/a","ms":5,"addr":{"zip":1},"tags":["a",3]})).0, "$.tags[1]");
        assert_eq!(err(json!({"url":"/a","ms":5,"addr":{"zip":1},"kind":"NOPE"})).0, "$.kind");
        assert!(err(json!({"url":"/a","ms":5,"addr":{"zip":1},"extra":1})).1.contains("extra"));
        assert_eq!(err(json!({"url":"/a","ms":5,"addr":{"zip":1},"prev":{"t.Addr":{"zip":true}}})).0, "$.prev<t.Addr>.zip");
        assert_eq!(err(json!({"url":"/a","ms":9_999_999_999_999_999_999u64 as f64,"addr":{"zip":1}})).0, "$.ms");
        assert_eq!(err(json!([1])).0, "$");
    }

    #[test]
    fn bytes_use_avro_json_code_points() {
        let s = Schema::parse_str(r#""bytes""#).unwrap();
        let framed = encode(1, &s, &json!("\u{0}\u{ff}"), 0).unwrap();
        assert_eq!(&framed[5..], &[4, 0, 0xff]);
        assert!(encode(1, &s, &json!("\u{100}"), 0).is_err());
        assert!(base64_decode("!!").unwrap_err().contains("base64"));
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
    }

    /// Issue #26: a schema with a `fixed` of 2^62 (stored by a registry that accepted it,
    /// handed over without the client's limits) meets the gateway: each value is a mismatch
    /// at its path, and nothing allocates the size or overflows on it.
    #[test]
    fn a_fixed_of_two_to_the_62_is_a_mismatch_not_an_abort() {
        for (ty, value) in [
            (r#"{"type":"fixed","name":"Huge","size":4611686018427387904}"#, json!("\u{0}")),
            (r#"{"type":"fixed","name":"D","size":4611686018427387904,"logicalType":"decimal","precision":4}"#, json!("\u{1}")),
            // Fits an i32, but eight times it does not: apache-avro's precision check overflowed.
            (r#"{"type":"fixed","name":"D","size":268435456,"logicalType":"decimal","precision":4}"#, json!("\u{1}")),
        ] {
            let s =
                Schema::parse_str(&format!(r#"{{"type":"record","name":"B","fields":[{{"name":"f","type":{ty}}}]}}"#)).unwrap();
            match encode(3, &s, &json!({ "f": value }), 0) {
                Err(Error::AvroMismatch { path, .. }) => assert_eq!(path, "$.f", "{ty}"),
                other => panic!("{ty}: expected a mismatch, got {other:?}"),
            }
        }
        // The registry client refuses such a schema: a 422 from the gateway.
        let refused = Error::from(fjord_schema_registry::Error::SchemaLimit {
            what: "fixed size (bytes)",
            actual: 1 << 62,
            limit: MAX_FIXED_SIZE,
            key: "max_fixed_size",
        });
        assert_eq!((refused.http_status(), refused.error_code()), (422, 42201));
    }

    proptest::proptest! {
        // PROPTEST_CASES (read by the default config) raises the count for a longer run.
        #![proptest_config(proptest::prelude::ProptestConfig { cases: proptest::prelude::ProptestConfig::default().cases.max(1_000), ..Default::default() })]

        /// Mutated JSON values (any JSON, or the good value with a field replaced by any
        /// JSON): the conversion answers a datum or a mismatch, never panics, and is quick.
        #[test]
        fn mutated_json_never_panics_and_is_quick(
            replace in proptest::option::of(0usize..7),
            leaf in json_value(),
        ) {
            let good = json!({"url":"/a","ms":5,"ref":{"string":"x"},"kind":"BUY","addr":{"zip":1234},"prev":{"t.Addr":{"zip":1}},"tags":["a"]});
            let doc = match replace {
                None => leaf,
                Some(i) => {
                    let mut doc = good;
                    let key = ["url", "ms", "ref", "kind", "addr", "prev", "tags"][i];
                    doc[key] = leaf;
                    doc
                }
            };
            let started = std::time::Instant::now();
            let _ = encode(7, &schema(), &doc, 0);
            proptest::prop_assert!(started.elapsed() < std::time::Duration::from_secs(1), "{doc}");
        }
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Json> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            ".{0,8}".prop_map(Json::String),
            Just(json!("t.Addr")),
            Just(json!("BUY")),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
                proptest::collection::btree_map("(zip|string|t.Addr|null|url|[a-z]{1,3})", inner, 0..4)
                    .prop_map(|m| Json::Object(m.into_iter().collect())),
            ]
        })
    }
}
