//! The client side: schema lookups by id over HTTP with a per-client cache, registration,
//! and the serializer / deserializer for Confluent-framed Avro (see [`crate::framing`]).
//!
//! Any Confluent-compatible registry works, Fjord's or Confluent's. Plain `http://` only:
//! the crate carries no TLS stack, to keep the dependency tree small (an `https://` URL is
//! refused by [`RegistryClient::new`]).
//!
//! ```no_run
//! # async fn demo() -> fjord_schema_registry::Result<()> {
//! use apache_avro::types::Value;
//! use fjord_schema_registry::RegistryClient;
//! let client = RegistryClient::new("http://127.0.0.1:8081")?;
//! let schema = r#"{"type":"record","name":"Click","fields":[{"name":"url","type":"string"}]}"#;
//! let value = Value::Record(vec![("url".into(), Value::String("/home".into()))]);
//! let payload = client.serialize("clicks-value", schema, value).await?;
//! let decoded = client.deserialize(&payload).await?;
//! assert_eq!(decoded.value, Value::Record(vec![("url".into(), Value::String("/home".into()))]));
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;
use serde::Deserialize;
use serde_json::json;

use crate::datum::DatumLimits;
use crate::framing::{frame, unframe};
use crate::schema::{ParsedSchema, SchemaLimits};
use crate::{Error, Result};

/// A decoded payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The schema id from the payload's header.
    pub schema_id: i32,
    /// The datum.
    pub value: Value,
}

/// A registry client. Ids are immutable, so cached schemas never go stale; share one client
/// (it is `Send + Sync`) to share its caches.
pub struct RegistryClient {
    http: reqwest::Client,
    base: String,
    by_id: RwLock<HashMap<i32, Arc<Schema>>>,
    /// (subject, canonical text) → id, so a producer registers each schema once per subject.
    registered: RwLock<HashMap<(String, String), i32>>,
    /// Bounds on the schemas this client takes from the registry and on the data it decodes
    /// with them: a schema beyond them is [`Error::SchemaLimit`], whatever the registry took.
    schema_limits: SchemaLimits,
    datum_limits: DatumLimits,
}

#[derive(Deserialize)]
struct ErrorDoc {
    error_code: i32,
    message: String,
}

impl RegistryClient {
    /// A client for the registry at `base_url` (e.g. `http://127.0.0.1:8081`).
    pub fn new(base_url: &str) -> Result<Self> {
        let base = base_url.trim_end_matches('/').to_string();
        if !base.starts_with("http://") || base.len() == "http://".len() {
            return Err(Error::BadUrl(base_url.to_string()));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|source| Error::Http { url: base.clone(), source })?;
        Ok(Self {
            http,
            base,
            by_id: RwLock::new(HashMap::new()),
            registered: RwLock::new(HashMap::new()),
            schema_limits: SchemaLimits::default(),
            datum_limits: DatumLimits::default(),
        })
    }

    /// The same client with other bounds on schemas and data (the defaults otherwise).
    pub fn with_limits(self, schema_limits: SchemaLimits, datum_limits: DatumLimits) -> Self {
        Self { schema_limits, datum_limits, ..self }
    }

    /// The bounds on data this client decodes.
    pub fn datum_limits(&self) -> &DatumLimits {
        &self.datum_limits
    }

    /// The schema with global id `id`: from the cache, else `GET /schemas/ids/{id}`.
    /// An id the registry does not know is [`Error::UnknownId`]; a schema beyond this client's
    /// limits (one registered before the registry enforced them, or by another registry) is
    /// [`Error::SchemaLimit`].
    pub async fn schema(&self, id: i32) -> Result<Arc<Schema>> {
        if let Some(hit) = self.by_id.read().expect("invariant: cache lock not poisoned").get(&id) {
            return Ok(hit.clone());
        }
        #[derive(Deserialize)]
        struct SchemaDoc {
            schema: String,
        }
        let doc: SchemaDoc = match self.call(reqwest::Method::GET, &format!("/schemas/ids/{id}"), None).await {
            Err(Error::Registry { error_code: 40403, .. }) => return Err(Error::UnknownId(id)),
            other => other?,
        };
        let schema = ParsedSchema::parse_with(&doc.schema, &self.schema_limits)?.schema;
        self.by_id.write().expect("invariant: cache lock not poisoned").insert(id, schema.clone());
        Ok(schema)
    }

    /// Registers `schema` under `subject` (once per client; later calls hit the cache) and
    /// returns its global id.
    pub async fn register(&self, subject: &str, schema: &str) -> Result<i32> {
        Ok(self.register_parsed(subject, &ParsedSchema::parse_with(schema, &self.schema_limits)?).await?.0)
    }

    async fn register_parsed(&self, subject: &str, parsed: &ParsedSchema) -> Result<(i32, Arc<Schema>)> {
        let key = (subject.to_string(), parsed.canonical.clone());
        let cached = self.registered.read().expect("invariant: cache lock not poisoned").get(&key).copied();
        let id = match cached {
            Some(id) => id,
            None => {
                #[derive(Deserialize)]
                struct IdDoc {
                    id: i32,
                }
                let path = format!("/subjects/{}/versions", encode_path_segment(subject));
                let doc: IdDoc = self.call(reqwest::Method::POST, &path, Some(json!({ "schema": parsed.canonical }))).await?;
                self.registered.write().expect("invariant: cache lock not poisoned").insert(key, doc.id);
                doc.id
            }
        };
        let mut by_id = self.by_id.write().expect("invariant: cache lock not poisoned");
        let schema = by_id.entry(id).or_insert_with(|| parsed.schema.clone()).clone();
        Ok((id, schema))
    }

    /// Registers `schema` under `subject` if needed and encodes `value` with it, framed.
    /// `value` is resolved against the schema first, so a value built from JSON
    /// (`Value::try_from(serde_json::Value)`: maps for records, strings for enums) works; a value
    /// that does not fit the schema is [`Error::Avro`].
    pub async fn serialize(&self, subject: &str, schema: &str, value: Value) -> Result<Vec<u8>> {
        let (id, schema) = self.register_parsed(subject, &ParsedSchema::parse_with(schema, &self.schema_limits)?).await?;
        encode(id, &schema, value)
    }

    /// Encodes `value` with the already registered schema `id`, framed.
    pub async fn serialize_with_id(&self, id: i32, value: Value) -> Result<Vec<u8>> {
        let schema = self.schema(id).await?;
        encode(id, &schema, value)
    }

    /// Decodes a framed payload with the writer's schema (looked up by the payload's id).
    pub async fn deserialize(&self, payload: &[u8]) -> Result<Decoded> {
        self.decode(payload, None).await
    }

    /// Decodes a framed payload, resolving the writer's schema to `reader` (Avro schema
    /// evolution: defaults filled in, promotions applied).
    pub async fn deserialize_as(&self, payload: &[u8], reader: &Schema) -> Result<Decoded> {
        self.decode(payload, Some(reader)).await
    }

    async fn decode(&self, payload: &[u8], reader: Option<&Schema>) -> Result<Decoded> {
        let (schema_id, datum) = unframe(payload)?;
        let writer = self.schema(schema_id).await?;
        let value = crate::datum::decode(&writer, reader, datum, schema_id, &self.datum_limits)?;
        Ok(Decoded { schema_id, value })
    }

    /// One request; a non-2xx answer becomes [`Error::Registry`] with Confluent's code.
    async fn call<T: for<'de> Deserialize<'de>>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T> {
        let url = format!("{}{path}", self.base);
        let http_err = |source| Error::Http { url: url.clone(), source };
        let mut request = self.http.request(method, &url).header(reqwest::header::ACCEPT, crate::api::CONTENT_TYPE);
        if let Some(body) = body {
            request = request.header(reqwest::header::CONTENT_TYPE, crate::api::CONTENT_TYPE).body(body.to_string());
        }
        let response = request.send().await.map_err(http_err)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(http_err)?;
        if !status.is_success() {
            let (error_code, message) = match serde_json::from_slice::<ErrorDoc>(&bytes) {
                Ok(doc) => (doc.error_code, doc.message),
                Err(_) => (i32::from(status.as_u16()), String::from_utf8_lossy(&bytes).into_owned()),
            };
            return Err(Error::Registry { status: status.as_u16(), error_code, message });
        }
        serde_json::from_slice(&bytes).map_err(|e| Error::Registry {
            status: status.as_u16(),
            error_code: 0,
            message: format!("unexpected response from {url}: {e}"),
        })
    }
}

/// Resolves `value` against `schema`, encodes it and frames it with `id`.
fn encode(id: i32, schema: &Schema, value: Value) -> Result<Vec<u8>> {
    let resolved = value.resolve(schema)?;
    Ok(frame(id, &GenericDatumWriter::builder(schema).build()?.write_value_to_vec(resolved)?))
}

/// Percent-encodes a subject for use as one URL path segment.
fn encode_path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_plain_http() {
        assert!(RegistryClient::new("http://127.0.0.1:8081/").is_ok());
        for bad in ["https://registry:8081", "127.0.0.1:8081", "http://", ""] {
            assert!(matches!(RegistryClient::new(bad), Err(Error::BadUrl(_))), "{bad}");
        }
    }

    #[test]
    fn subjects_are_one_path_segment() {
        assert_eq!(encode_path_segment("orders-value"), "orders-value");
        assert_eq!(encode_path_segment("a/b c"), "a%2Fb%20c");
    }
}
