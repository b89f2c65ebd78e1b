//! Parsing a submitted schema and deciding its identity.
//!
//! The registry keys schemas on a *canonical text*: the schema parsed by `apache-avro` and
//! written back as compact JSON. Whitespace, key order and the string-vs-object spelling of
//! primitives (`"int"` vs `{"type":"int"}`) disappear, but everything that changes how data
//! resolves (field defaults, aliases, logical types, enum defaults) is kept. We deliberately
//! do not key on Avro's *Parsing Canonical Form*: it strips defaults, so two schemas that
//! differ only in a field default would share one id and one of the defaults would be lost.

use apache_avro::Schema;
use sha2::{Digest, Sha256};

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
        Ok(Self { schema, canonical })
    }

    /// SHA-256 of the canonical text, hex: the key of the canonical-text → id index.
    pub fn fingerprint(&self) -> String {
        Sha256::digest(self.canonical.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_and_key_order_do_not_change_identity() {
        let a = ParsedSchema::parse(r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}"#).unwrap();
        let b = ParsedSchema::parse("{ \"fields\" : [ {\"type\":{\"type\":\"int\"}, \"name\":\"a\"} ],\n \"name\":\"R\", \"type\":\"record\" }")
            .unwrap();
        assert_eq!(a.canonical, b.canonical);
        assert_eq!(a.fingerprint(), b.fingerprint());
    }

    #[test]
    fn defaults_are_part_of_identity() {
        let a = ParsedSchema::parse(r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":1}]}"#).unwrap();
        let b = ParsedSchema::parse(r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":2}]}"#).unwrap();
        assert_ne!(a.canonical, b.canonical);
    }

    #[test]
    fn garbage_is_an_invalid_schema_with_the_parser_message() {
        for bad in ["", "{", r#"{"type":"nope"}"#, r#"{"type":"record","name":"R"}"#, r#"{"type":"enum","name":"E","symbols":["A","A"]}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":"x"}]}"#,
            r#"{"type":"enum","name":"E","symbols":["A"],"default":"Z"}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"a","type":"Nope"}]}"#,
        ] {
            match ParsedSchema::parse(bad) {
                Err(Error::InvalidSchema(msg)) => assert!(!msg.is_empty(), "{bad}"),
                other => panic!("{bad}: expected InvalidSchema, got {other:?}"),
            }
        }
    }
}
