//! Parsing a submitted schema and deciding its identity.
//!
//! The registry keys schemas on a *canonical text*: the schema parsed by `apache-avro` and
//! written back as compact JSON. Whitespace, key order and the string-vs-object spelling of
//! primitives (`"int"` vs `{"type":"int"}`) disappear, but everything that changes how data
//! resolves (field defaults, aliases, logical types, enum defaults) is kept. We deliberately
//! do not key on Avro's *Parsing Canonical Form*: it strips defaults, so two schemas that
//! differ only in a field default would share one id and one of the defaults would be lost.

use std::collections::HashMap;

use apache_avro::Schema;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use crate::compat::{names, shape, Shape};
use crate::{Error, Result};

/// A schema that parsed, with its canonical text.
#[derive(Debug, Clone)]
pub struct ParsedSchema {
    /// The parsed schema, for compatibility checks and (de)serialization.
    pub schema: Schema,
    /// Compact JSON written back from `schema`: what the registry stores and serves, and
    /// what decides whether two submissions are "the same schema".
    pub canonical: String,
}

impl ParsedSchema {
    /// Parses Avro schema JSON; any parser complaint becomes [`Error::InvalidSchema`] with the
    /// parser's message (REST: 422 / 42201).
    pub fn parse(text: &str) -> Result<Self> {
        let schema = Schema::parse_str(text).map_err(|e| Error::InvalidSchema(e.to_string()))?;
        let canonical =
            serde_json::to_string(&schema).map_err(|e| Error::InvalidSchema(format!("cannot write the schema back: {e}")))?;
        // Round-trip guard: what we store must parse again to the same thing, otherwise a later
        // reader of the stored text would see a different schema than the one we checked.
        let again = Schema::parse_str(&canonical)
            .map_err(|e| Error::InvalidSchema(format!("schema does not survive a write/parse round trip: {e}")))?;
        if serde_json::to_string(&again).ok().as_deref() != Some(canonical.as_str()) {
            return Err(Error::InvalidSchema("schema does not survive a write/parse round trip".into()));
        }
        check_union_defaults(&schema)?;
        Ok(Self { schema, canonical })
    }

    /// SHA-256 of the canonical text, hex: the key of the canonical-text → id index.
    pub fn fingerprint(&self) -> String {
        Sha256::digest(self.canonical.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The Avro spec: the default of a union-typed field is a value of the union's *first*
/// type. `apache-avro` accepts a default matching any branch, but Java Avro (and so
/// Confluent's registry and the Java clients, which would fail to parse the schema they get
/// from us) rejects those, so we do too.
fn check_union_defaults(schema: &Schema) -> Result<()> {
    let names = names(schema);
    for (name, def) in &names {
        let Schema::Record(record) = def else { continue };
        for field in &record.fields {
            let (Some(default), Shape::Union(branches)) = (&field.default, shape(&field.schema, &names)) else { continue };
            let Some(first) = branches.first() else { continue };
            if !default_fits(default, first, &names) {
                return Err(Error::InvalidSchema(format!(
                    "the default {default} of field '{}' in record {name} must be a value of the first type of its union ({})",
                    field.name,
                    shape(first, &names).type_name()
                )));
            }
        }
    }
    Ok(())
}

/// Whether a JSON default is a value of `schema` in Avro's JSON default encoding.
fn default_fits(json: &Json, schema: &Schema, names: &HashMap<String, &Schema>) -> bool {
    match shape(schema, names) {
        Shape::Null => json.is_null(),
        Shape::Boolean => json.is_boolean(),
        Shape::Int => json.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
        Shape::Long => json.is_i64(),
        Shape::Float | Shape::Double => json.is_number(),
        Shape::Bytes | Shape::String | Shape::Fixed(_) => json.is_string(),
        Shape::Enum(e) => json.as_str().is_some_and(|s| e.symbols.iter().any(|sym| sym == s)),
        Shape::Array(items) => json.as_array().is_some_and(|a| a.iter().all(|v| default_fits(v, items, names))),
        Shape::Map(values) => json.as_object().is_some_and(|m| m.values().all(|v| default_fits(v, values, names))),
        Shape::Union(branches) => branches.first().is_some_and(|first| default_fits(json, first, names)),
        Shape::Record(r) => json.as_object().is_some_and(|m| {
            r.fields.iter().all(|f| match m.get(&f.name) {
                Some(v) => default_fits(v, &f.schema, names),
                None => f.default.is_some(),
            })
        }),
        Shape::Unresolved(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_and_key_order_do_not_change_identity() {
        let a = ParsedSchema::parse(r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}"#).unwrap();
        let b = ParsedSchema::parse(
            "{ \"fields\" : [ {\"type\":{\"type\":\"int\"}, \"name\":\"a\"} ],\n \"name\":\"R\", \"type\":\"record\" }",
        )
        .unwrap();
        assert_eq!(a.canonical, b.canonical);
        assert_eq!(a.fingerprint(), b.fingerprint());
    }

    #[test]
    fn union_defaults_of_the_first_branch_are_fine() {
        for good in [
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":["null","int"],"default":null}]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":["int","null"],"default":5}]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":["string","null"],"default":"x"}]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"e","type":{"type":"enum","name":"E","symbols":["A"]}},
                {"name":"a","type":["E","null"],"default":"A"}]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":[{"type":"record","name":"In","fields":[{"name":"x","type":"int","default":1}]},"null"],"default":{}}]}"#,
        ] {
            ParsedSchema::parse(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }

    #[test]
    fn nesting_is_bounded_by_the_json_parser_not_the_stack() {
        let nested = |depth: usize| {
            let mut s = String::from("\"int\"");
            for _ in 0..depth {
                s = format!(r#"{{"type":"array","items":{s}}}"#);
            }
            s
        };
        ParsedSchema::parse(&nested(40)).unwrap();
        assert!(matches!(ParsedSchema::parse(&nested(10_000)), Err(Error::InvalidSchema(_))));
    }

    #[test]
    fn defaults_are_part_of_identity() {
        let a = ParsedSchema::parse(r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":1}]}"#).unwrap();
        let b = ParsedSchema::parse(r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":2}]}"#).unwrap();
        assert_ne!(a.canonical, b.canonical);
    }

    #[test]
    fn garbage_is_an_invalid_schema_with_the_parser_message() {
        for bad in [
            "",
            "{",
            r#"{"type":"nope"}"#,
            r#"{"type":"record","name":"R"}"#,
            r#"{"type":"enum","name":"E","symbols":["A","A"]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":"x"}]}"#,
            r#"{"type":"enum","name":"E","symbols":["A"],"default":"Z"}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"Nope"}]}"#,
            // Union defaults must match the first branch.
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":["null","int"],"default":5}]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":["int","null"],"default":null}]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":{"type":"array","items":"int"},"default":[1,"x"]}]}"#,
        ] {
            match ParsedSchema::parse(bad) {
                Err(Error::InvalidSchema(msg)) => assert!(!msg.is_empty(), "{bad}"),
                other => panic!("{bad}: expected InvalidSchema, got {other:?}"),
            }
        }
    }
}
