//! Parsing a submitted schema and deciding its identity.
//!
//! The registry keys schemas on a *canonical text*: the schema parsed by `apache-avro` and
//! written back as compact JSON. Whitespace, key order and the string-vs-object spelling of
//! primitives (`"int"` vs `{"type":"int"}`) disappear, but everything that changes how data
//! resolves (field defaults, aliases, logical types, enum defaults) is kept. We deliberately
//! do not key on Avro's *Parsing Canonical Form*: it strips defaults, so two schemas that
//! differ only in a field default would share one id and one of the defaults would be lost.

use std::collections::HashMap;
use std::sync::Arc;

use apache_avro::schema::{DecimalSchema, InnerDecimalSchema, UuidSchema};
use apache_avro::Schema;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use crate::compat::{names, shape, Shape};
use crate::{Error, Result};

/// Bounds on a schema, checked whenever one is parsed: at registration (from
/// [`RegistryConfig`](crate::RegistryConfig)) and by clients before they decode with it.
///
/// Avro itself bounds none of these, and Confluent's registry accepts anything its parser
/// takes. Each default is far above what real schemas use, and each bounds something that
/// otherwise grows without limit: the CPU of parsing and checking (size, named types), the
/// stack of every recursive walk over a schema or a datum (depth), and the buffer a decoder
/// allocates for a `fixed` before it reads a byte (fixed size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaLimits {
    /// Longest schema text, in bytes. Default 1 MiB: ZooKeeper's default node limit
    /// (`jute.maxbuffer`) is 1 MiB, so a larger schema could not be stored in a cluster anyway.
    pub max_schema_bytes: usize,
    /// Most named types (records, enums, fixed) one schema may define. Default 10,000.
    pub max_named_types: usize,
    /// Deepest nesting of records, arrays, maps and unions, counting through references to
    /// named types defined elsewhere in the schema (a reference back into a type being
    /// defined, i.e. recursion, ends the count: how deep a recursive type goes is a property
    /// of each datum, bounded when decoding). Default 32: a dozen nested optional records
    /// take 24, and apache-avro decodes by recursion with large frames (in a debug build 60
    /// levels overflowed a 2 MiB thread stack), so the decoders' bound is the same.
    pub max_depth: usize,
    /// Largest `fixed` size (also for decimal, uuid and duration on fixed). Default 1 MiB, the
    /// largest record value a broker takes by default (`max.message.bytes`): a larger fixed
    /// could never hold data, and decoders (apache-avro among them) allocate the whole size
    /// before reading, so a `fixed` of 2^62 aborts a process that merely tries.
    pub max_fixed_size: usize,
}

impl Default for SchemaLimits {
    fn default() -> Self {
        Self { max_schema_bytes: 1024 * 1024, max_named_types: 10_000, max_depth: 32, max_fixed_size: 1024 * 1024 }
    }
}

/// A schema that parsed, with its canonical text.
#[derive(Debug, Clone)]
pub struct ParsedSchema {
    /// The parsed schema, for compatibility checks and (de)serialization; shared, so checks
    /// can run on another thread without copying it.
    pub schema: Arc<Schema>,
    /// Compact JSON written back from `schema`: what the registry stores and serves, and
    /// what decides whether two submissions are "the same schema".
    pub canonical: String,
    /// SHA-256 of `canonical`, hex.
    fingerprint: String,
}

impl ParsedSchema {
    /// [`ParsedSchema::parse_with`] under the default [`SchemaLimits`].
    pub fn parse(text: &str) -> Result<Self> {
        Self::parse_with(text, &SchemaLimits::default())
    }

    /// Parses Avro schema JSON; any parser complaint becomes [`Error::InvalidSchema`] with the
    /// parser's message, a schema beyond `limits` [`Error::SchemaLimit`] (REST: 422 / 42201 both).
    /// CPU-heavy for large schemas (linear in the text): the registry calls it off the async
    /// workers.
    pub fn parse_with(text: &str, limits: &SchemaLimits) -> Result<Self> {
        if text.len() > limits.max_schema_bytes {
            return Err(Error::SchemaLimit {
                what: "schema text (bytes)",
                actual: text.len(),
                limit: limits.max_schema_bytes,
                key: "max_schema_bytes",
            });
        }
        let json: Json = serde_json::from_str(text).map_err(|e| Error::InvalidSchema(format!("malformed JSON: {e}")))?;
        // Sizes are checked on the JSON before apache-avro sees them: its decimal precision
        // arithmetic overflows (a debug-build panic) on sizes near 2^28.
        check_json_sizes(&json, limits)?;
        let schema = parse_json(&json)?;
        check_limits(&schema, limits)?;
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
        let fingerprint = Sha256::digest(canonical.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self { schema: Arc::new(schema), canonical, fingerprint })
    }

    /// SHA-256 of the canonical text, hex: the key of the canonical-text → id index.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}

/// apache-avro's parser on an already parsed JSON document. A panic inside it (a bug in a
/// third-party parser fed hostile input) becomes an invalid schema instead of taking the
/// thread, and with it a request or a loader run, down.
fn parse_json(json: &Json) -> Result<Schema> {
    match std::panic::catch_unwind(|| Schema::parse(json)) {
        Ok(parsed) => parsed.map_err(|e| Error::InvalidSchema(e.to_string())),
        Err(_) => Err(Error::InvalidSchema("the Avro schema parser failed on this schema".into())),
    }
}

/// Refuses any `"size"` above [`SchemaLimits::max_fixed_size`] anywhere in the document.
/// Iterative, so hostile nesting cannot exhaust the stack here (serde_json already refused
/// documents nested more than 128 deep).
fn check_json_sizes(json: &Json, limits: &SchemaLimits) -> Result<()> {
    let mut stack = vec![json];
    while let Some(v) = stack.pop() {
        match v {
            Json::Array(items) => stack.extend(items),
            Json::Object(map) => {
                if let Some(size) = map.get("size").and_then(Json::as_u64) {
                    if size > limits.max_fixed_size as u64 {
                        return Err(Error::SchemaLimit {
                            what: "fixed size (bytes)",
                            actual: usize::try_from(size).unwrap_or(usize::MAX),
                            limit: limits.max_fixed_size,
                            key: "max_fixed_size",
                        });
                    }
                }
                stack.extend(map.values());
            }
            _ => {}
        }
    }
    Ok(())
}

/// Counts named types and measures nesting depth (through references, see
/// [`SchemaLimits::max_depth`]). Recursion here is bounded by `max_depth` itself: the walk
/// stops as soon as it is deeper than allowed.
fn check_limits(schema: &Schema, limits: &SchemaLimits) -> Result<()> {
    struct Measure<'a> {
        limits: &'a SchemaLimits,
        /// Height of each named type walked so far; `None` while it is being walked.
        heights: HashMap<String, Option<usize>>,
    }
    impl Measure<'_> {
        fn too_deep(&self, actual: usize) -> Error {
            Error::SchemaLimit { what: "nesting depth", actual, limit: self.limits.max_depth, key: "max_depth" }
        }

        fn named(&mut self, fullname: String, height: Option<usize>) -> Result<()> {
            if self.heights.insert(fullname, height).is_none() && self.heights.len() > self.limits.max_named_types {
                return Err(Error::SchemaLimit {
                    what: "number of named types",
                    actual: self.heights.len(),
                    limit: self.limits.max_named_types,
                    key: "max_named_types",
                });
            }
            Ok(())
        }

        /// Height of `s` (1 for a leaf) found at nesting `level` (1 at the top).
        fn height(&mut self, s: &Schema, level: usize) -> Result<usize> {
            if level > self.limits.max_depth {
                return Err(self.too_deep(level));
            }
            let below = |this: &mut Self, children: &mut dyn Iterator<Item = &Schema>| -> Result<usize> {
                let mut h = 0;
                for child in children {
                    h = h.max(this.height(child, level + 1)?);
                }
                Ok(1 + h)
            };
            Ok(match s {
                Schema::Record(r) => {
                    let name = r.name.fullname(None);
                    self.named(name.clone(), None)?;
                    let h = below(self, &mut r.fields.iter().map(|f| &f.schema))?;
                    self.heights.insert(name, Some(h));
                    h
                }
                Schema::Enum(e) => {
                    self.named(e.name.fullname(None), Some(1))?;
                    1
                }
                Schema::Fixed(f)
                | Schema::Duration(f)
                | Schema::Uuid(UuidSchema::Fixed(f))
                | Schema::Decimal(DecimalSchema { inner: InnerDecimalSchema::Fixed(f), .. }) => {
                    // Also checked on the JSON; this catches sizes apache-avro derived itself.
                    if f.size > self.limits.max_fixed_size {
                        return Err(Error::SchemaLimit {
                            what: "fixed size (bytes)",
                            actual: f.size,
                            limit: self.limits.max_fixed_size,
                            key: "max_fixed_size",
                        });
                    }
                    self.named(f.name.fullname(None), Some(1))?;
                    1
                }
                Schema::Array(a) => below(self, &mut std::iter::once(&*a.items))?,
                Schema::Map(m) => below(self, &mut std::iter::once(&*m.types))?,
                Schema::Union(u) => below(self, &mut u.variants().iter())?,
                Schema::Ref { name } => match self.heights.get(&name.fullname(None)) {
                    Some(Some(h)) => {
                        let reached = level + h - 1;
                        if reached > self.limits.max_depth {
                            return Err(self.too_deep(reached));
                        }
                        *h
                    }
                    // Recursion (the type is being defined around us), or a name the parser
                    // would not have let through.
                    _ => 0,
                },
                _ => 1,
            })
        }
    }
    Measure { limits, heights: HashMap::new() }.height(schema, 1).map(drop)
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
        // 31 arrays around an int: 32 levels, the default bound; one more is refused by it,
        // and far more by serde_json's nesting limit before anything recurses.
        ParsedSchema::parse(&nested(31)).unwrap();
        match ParsedSchema::parse(&nested(32)) {
            Err(Error::SchemaLimit { key: "max_depth", actual: 33, limit: 32, .. }) => {}
            other => panic!("expected the depth limit, got {other:?}"),
        }
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

    /// Issue #26: a `fixed` of 2^62 was accepted, and every decoder that met it aborted.
    #[test]
    fn sizes_beyond_the_limits_are_refused_with_the_key_that_sets_them() {
        let fixed = |size: &str| format!(r#"{{"type":"fixed","name":"F","size":{size}}}"#);
        ParsedSchema::parse(&fixed("1048576")).unwrap();
        for size in ["1048577", "4611686018427387904", "18446744073709551615"] {
            match ParsedSchema::parse(&fixed(size)) {
                Err(Error::SchemaLimit { key: "max_fixed_size", limit: 1_048_576, .. }) => {}
                other => panic!("{size}: expected the fixed size limit, got {other:?}"),
            }
        }
        let tight = SchemaLimits { max_schema_bytes: 100, max_named_types: 2, max_depth: 3, max_fixed_size: 16 };
        let named = r#"[{"type":"enum","name":"A","symbols":["X"]},{"type":"enum","name":"B","symbols":["X"]},{"type":"enum","name":"C","symbols":["X"]}]"#;
        let err = ParsedSchema::parse_with(named, &SchemaLimits { max_named_types: 2, ..SchemaLimits::default() }).unwrap_err();
        assert!(matches!(err, Error::SchemaLimit { key: "max_named_types", actual: 3, limit: 2, .. }), "{err:?}");
        let err = ParsedSchema::parse_with(&" ".repeat(101), &tight).unwrap_err();
        assert!(matches!(err, Error::SchemaLimit { key: "max_schema_bytes", actual: 101, .. }), "{err:?}");
        // The message says what to change.
        assert!(err.to_string().contains("config key max_schema_bytes"), "{err}");
        // Recursion ends the depth count: a linked list is two levels deep (record, union).
        ParsedSchema::parse_with(r#"{"type":"record","name":"L","fields":[{"name":"n","type":["null","L"]}]}"#, &tight).unwrap();
    }

    /// Seeds for the mutation test: every kind of type, references, recursion, defaults.
    const SEEDS: &[&str] = &[
        r#"{"type":"record","name":"R","namespace":"t","fields":[{"name":"a","type":"int","default":1},{"name":"b","type":["null","string"],"default":null},{"name":"c","type":{"type":"array","items":{"type":"map","values":"long"}}},{"name":"e","type":{"type":"enum","name":"E","symbols":["X","Y"],"default":"X"}},{"name":"f","type":{"type":"fixed","name":"F","size":16,"logicalType":"uuid"}},{"name":"g","type":["E","F"]},{"name":"next","type":["null","R"],"default":null}]}"#,
        r#"{"type":"record","name":"D","fields":[{"name":"d","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},{"name":"t","type":{"type":"long","logicalType":"timestamp-millis"}},{"name":"x","type":{"type":"fixed","name":"X","size":8,"logicalType":"decimal","precision":10}}]}"#,
        r#"[{"type":"record","name":"A","fields":[{"name":"v","type":"double"}]},{"type":"record","name":"B","fields":[{"name":"a","type":"A"}]},"null"]"#,
    ];

    proptest::proptest! {
        // PROPTEST_CASES (read by the default config) raises the count for a longer run.
        #![proptest_config(proptest::prelude::ProptestConfig { cases: proptest::prelude::ProptestConfig::default().cases.max(2_000), ..Default::default() })]

        /// Mutated schema JSON (characters replaced, inserted, removed, numbers made huge,
        /// pieces repeated): parsing answers a schema or an error, never panics, and is quick.
        #[test]
        fn mutated_schema_json_never_panics_and_is_quick(
            seed in 0..SEEDS.len(),
            edits in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), 0u8..5, proptest::prelude::any::<proptest::sample::Index>()), 1..6),
        ) {
            const PIECES: &[&str] = &["{", "}", "[", "]", "\"", ",", ":", "4611686018427387904", "-1", "1e308", "null",
                r#""type":"fixed","name":"Z","size":9223372036854775807"#, r#"{"type":"array","items":"#, r#""R""#, r#""logicalType":"decimal""#];
            let mut text: Vec<char> = SEEDS[seed].chars().collect();
            for (at, op, piece) in edits {
                let i = at.index(text.len() + 1);
                match op {
                    0 if i < text.len() => { text.remove(i); }
                    1 => text.splice(i..i, PIECES[piece.index(PIECES.len())].chars()).for_each(drop),
                    2 if i < text.len() => text[i] = PIECES[piece.index(PIECES.len())].chars().next().unwrap_or(' '),
                    3 => { let end = (i + piece.index(40)).min(text.len()); let copy: Vec<char> = text[i..end].to_vec(); text.splice(i..i, copy); }
                    _ => {}
                }
            }
            let text: String = text.into_iter().collect();
            let started = crate::thread_cpu();
            let _ = ParsedSchema::parse(&text);
            let took = crate::thread_cpu() - started;
            proptest::prop_assert!(took < std::time::Duration::from_secs(1), "took {took:?} of CPU: {text}");
        }
    }
}
