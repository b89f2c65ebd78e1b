//! The client side: schema lookups by id over HTTP with a per-client cache, registration,
//! and the serializer / deserializer for Confluent-framed Avro (see [`crate::framing`]).
//!
//! Any Confluent-compatible registry works, Fjord's or Confluent's, over `http://`, or over
//! `https://` with HTTP Basic credentials when given a [`ClientSecurity`]
//! ([`RegistryClient::with_security`]): the CA file the registry's certificate chains to
//! (only that CA is trusted, never the system's roots) and Confluent's
//! `basic.auth.user.info`.
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
use std::path::PathBuf;
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

/// How a [`RegistryClient`] reaches a secured registry, with the keys of Confluent's
/// clients (`ssl.ca.location`, `basic.auth.user.info`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientSecurity {
    /// PEM file of the CA certificates the registry's certificate chains to; an
    /// `https://` URL needs it.
    pub ca_location: Option<PathBuf>,
    /// `user:password`, sent as HTTP Basic with every request; never printed.
    pub basic_auth_user_info: Option<String>,
}

impl std::fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = self.basic_auth_user_info.as_deref().map(|info| info.split(':').next().unwrap_or_default());
        f.debug_struct("ClientSecurity").field("ca_location", &self.ca_location).field("basic_auth_user", &user).finish()
    }
}

impl ClientSecurity {
    /// Sets one key by its Confluent client name (`ssl.ca.location`, also taken as
    /// `ssl.truststore.location` holding PEM, and `basic.auth.user.info`); `Ok(false)`
    /// when `key` is not one.
    pub fn set(&mut self, key: &str, value: &str) -> std::result::Result<bool, String> {
        match key {
            "ssl.ca.location" | "ssl.truststore.location" => self.ca_location = Some(PathBuf::from(value)),
            "basic.auth.user.info" => {
                if !value.contains(':') {
                    return Err("basic.auth.user.info must be USER:PASSWORD".into());
                }
                self.basic_auth_user_info = Some(value.to_owned());
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The rustls client config trusting exactly the CA file (on ring, as the rest of
    /// Fjord's TLS).
    fn tls_config(&self, base: &str) -> Result<Option<rustls::ClientConfig>> {
        use rustls_pki_types::pem::PemObject;
        let Some(ca) = &self.ca_location else { return Ok(None) };
        let bad = |reason: String| Error::Tls { path: ca.clone(), reason };
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(ca)
            .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
            .map_err(|e| bad(format!("reading certificates: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        if roots.add_parsable_certificates(certs).0 == 0 {
            return Err(bad(format!("no usable CA certificate for {base}")));
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Some(config))
    }
}

/// A registry client. Ids are immutable, so cached schemas never go stale; share one client
/// (it is `Send + Sync`) to share its caches.
pub struct RegistryClient {
    transport: Transport,
    base: String,
    /// `basic.auth.user.info`, split.
    basic_auth: Option<(String, String)>,
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
        Self::with_security(base_url, &ClientSecurity::default())
    }

    /// A client for the registry at `base_url`, `http://` or `https://` (which needs
    /// `security.ca_location`), sending `security`'s Basic credentials if any.
    pub fn with_security(base_url: &str, security: &ClientSecurity) -> Result<Self> {
        let base = base_url.trim_end_matches('/').to_string();
        let https = base.starts_with("https://") && base.len() > "https://".len();
        if !(https || base.starts_with("http://") && base.len() > "http://".len()) {
            return Err(Error::BadUrl(base_url.to_string()));
        }
        let transport = match (https, security.tls_config(&base)?) {
            (true, Some(tls)) => Transport::Https(Https::new(&base, tls)?),
            (true, None) => {
                return Err(Error::Tls {
                    path: PathBuf::new(),
                    reason: format!("{base} is https:// and no CA file (ssl.ca.location) is given"),
                })
            }
            (false, _) => Transport::Http(
                reqwest::Client::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .timeout(REQUEST_TIMEOUT)
                    .build()
                    .map_err(|source| Error::Http { url: base.clone(), source })?,
            ),
        };
        let basic_auth = security.basic_auth_user_info.as_deref().and_then(|info| info.split_once(':'));
        Ok(Self {
            transport,
            base,
            basic_auth: basic_auth.map(|(user, password)| (user.to_owned(), password.to_owned())),
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
        let (status, bytes) = match &self.transport {
            Transport::Http(http) => {
                let http_err = |source| Error::Http { url: url.clone(), source };
                let mut request = http.request(method, &url).header(reqwest::header::ACCEPT, crate::api::CONTENT_TYPE);
                if let Some((user, password)) = &self.basic_auth {
                    request = request.basic_auth(user, Some(password));
                }
                if let Some(body) = body {
                    request = request.header(reqwest::header::CONTENT_TYPE, crate::api::CONTENT_TYPE).body(body.to_string());
                }
                let response = request.send().await.map_err(http_err)?;
                let status = response.status();
                (status, response.bytes().await.map_err(http_err)?)
            }
            Transport::Https(https) => {
                let exchange = https.call(method, path, self.basic_auth.as_ref(), body.map(|b| b.to_string()));
                let https_err = |reason: String| Error::Https { url: url.clone(), reason };
                tokio::time::timeout(REQUEST_TIMEOUT, exchange)
                    .await
                    .map_err(|_| https_err(format!("no answer within {REQUEST_TIMEOUT:?}")))?
                    .map_err(https_err)?
            }
        };
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

/// Bounds on one request: connecting, and the whole exchange.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response body read from an `https://` registry (a schema document is far
/// smaller; Fjord's registry bounds schemas well below this).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How requests reach the registry.
enum Transport {
    /// `http://`: reqwest, pooled.
    Http(reqwest::Client),
    /// `https://`: a rustls connection per request (see [`Https`]).
    Https(Https),
}

/// An `https://` registry: one TLS connection and one HTTP/1.1 request per call, on
/// rustls with the given CA only. reqwest's own TLS is not used: its rustls features,
/// unified across the workspace, would make every plain-HTTP reqwest client of every
/// Fjord crate need a process-wide crypto provider. A connection per call is enough for
/// this client: schemas are cached by id, so registry calls are rare.
struct Https {
    connector: tokio_rustls::TlsConnector,
    /// `host:port`, dialled and sent as `Host`.
    authority: String,
    /// The certificate's expected name (DNS name or IP address).
    server_name: rustls_pki_types::ServerName<'static>,
    /// The base URL's path, before every request path.
    prefix: String,
}

impl Https {
    fn new(base: &str, tls: rustls::ClientConfig) -> Result<Self> {
        let bad = || Error::BadUrl(base.to_string());
        let rest = base.strip_prefix("https://").ok_or_else(bad)?;
        let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        // `host`, `host:port`, `[v6]` or `[v6]:port`; the port defaults to 443.
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or_else(bad)?;
                (host, after.strip_prefix(':'))
            }
            None => match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            },
        };
        let port: u16 = port.unwrap_or("443").parse().map_err(|_| bad())?;
        let server_name = rustls_pki_types::ServerName::try_from(host.to_owned()).map_err(|_| bad())?;
        let authority = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        Ok(Self { connector: tokio_rustls::TlsConnector::from(Arc::new(tls)), authority, server_name, prefix: prefix.to_owned() })
    }

    /// One request: (status, body); a transport failure as text.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        basic_auth: Option<&(String, String)>,
        body: Option<String>,
    ) -> std::result::Result<(reqwest::StatusCode, hyper::body::Bytes), String> {
        use base64::Engine as _;
        use http_body_util::BodyExt as _;
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&self.authority))
            .await
            .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
            .map_err(|e| format!("connecting: {e}"))?;
        let tls = self.connector.connect(self.server_name.clone(), tcp).await.map_err(|e| format!("TLS handshake: {e}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        // Drives the connection until the answer is read and `sender` is dropped.
        let driver = tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.prefix))
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::ACCEPT, crate::api::CONTENT_TYPE);
        if let Some((user, password)) = basic_auth {
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            request = request.header(hyper::header::AUTHORIZATION, format!("Basic {token}"));
        }
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, crate::api::CONTENT_TYPE);
        }
        let request = request
            .body(http_body_util::Full::new(hyper::body::Bytes::from(body.unwrap_or_default())))
            .map_err(|e| format!("building the request: {e}"))?;
        let response = sender.send_request(request).await.map_err(|e| format!("request: {e}"))?;
        let status = response.status();
        let bytes = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        drop(sender);
        driver.abort();
        Ok((status, bytes))
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
    fn urls_must_be_http_or_https_with_a_ca() {
        assert!(RegistryClient::new("http://127.0.0.1:8081/").is_ok());
        for bad in ["127.0.0.1:8081", "http://", "https://", "ftp://registry", ""] {
            assert!(matches!(RegistryClient::new(bad), Err(Error::BadUrl(_))), "{bad}");
        }
        let error = RegistryClient::new("https://registry:8081").err().expect("https:// without a CA");
        assert!(error.to_string().contains("ssl.ca.location"), "{error}");
        assert!(matches!(RegistryClient::new("https://"), Err(Error::BadUrl(_))));
        let missing = ClientSecurity { ca_location: Some("/nonexistent/ca.pem".into()), basic_auth_user_info: None };
        let error = RegistryClient::with_security("https://registry:8081", &missing).err().expect("an unreadable CA file");
        assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");
    }

    #[test]
    fn https_urls_give_the_address_the_name_and_the_prefix() {
        let tls = || {
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        };
        for (url, authority, name, prefix) in [
            ("https://127.0.0.1:8081", "127.0.0.1:8081", "127.0.0.1", ""),
            ("https://registry.example.com/sr", "registry.example.com:443", "registry.example.com", "/sr"),
            ("https://[::1]:8081/a/b", "[::1]:8081", "::1", "/a/b"),
        ] {
            let https = Https::new(url, tls()).unwrap();
            assert_eq!((https.authority.as_str(), https.prefix.as_str()), (authority, prefix), "{url}");
            assert_eq!(https.server_name.to_str(), name, "{url}");
        }
        for bad in ["https://host:port", "https://[::1", "https://bad name:1"] {
            assert!(Https::new(bad, tls()).is_err(), "{bad}");
        }
    }

    #[test]
    fn security_keys_and_a_debug_without_the_password() {
        let mut security = ClientSecurity::default();
        assert_eq!(security.set("basic.auth.user.info", "gateway:s3cret"), Ok(true));
        assert_eq!(security.set("ssl.truststore.location", "ca.pem"), Ok(true));
        assert_eq!(security.set("url", "x"), Ok(false));
        assert!(security.set("basic.auth.user.info", "no-colon").is_err());
        let shown = format!("{security:?}");
        assert!(shown.contains("gateway") && !shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn subjects_are_one_path_segment() {
        assert_eq!(encode_path_segment("orders-value"), "orders-value");
        assert_eq!(encode_path_segment("a/b c"), "a%2Fb%20c");
    }
}
