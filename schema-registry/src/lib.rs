//! Fjord's Avro schema registry: the Confluent Schema Registry REST API on Fjord's metadata
//! store, and the client side (cached id → schema lookups and the Confluent framing).
//!
//! Events carry a schema id and Avro bytes; the registry turns ids back into schemas. Speaking
//! Confluent's API and framing means existing serializers (Java, Python `confluent-kafka`,
//! kcat `-s avro`, Spark, Flink) read and write Fjord's data unchanged.
//!
//! # Layout
//! - [`schema`]: parsing (apache-avro) and the canonical text that decides schema identity.
//! - [`compat`]: compatibility levels and the reader/writer resolution checker.
//! - [`store`]: subjects, versions, ids and config as znodes under `/schemas` in the
//!   metadata store (ZooKeeper in a cluster, embedded in `fjord dev`), plus an id → schema
//!   cache per instance.
//! - [`api`]: the axum REST service, [`RegistryConfig`] and [`run`].
//! - `auth`: TLS, HTTP Basic and ACLs on `Subject` resources (what each request needs).
//! - [`datum`]: bounded decoding of one datum (every length, size, count and depth checked
//!   against the bytes left and the limits before apache-avro allocates anything).
//! - [`framing`]: magic byte 0, 4-byte big-endian schema id, Avro binary.
//! - [`client`]: HTTP client with an id → schema cache, and the serializer / deserializer.
//!
//! # Invariants
//! - One canonical schema text has one global id, whichever subject or instance registered
//!   it; ids come from a compare-and-set counter in the store, so instances sharing a store
//!   never hand out the same id twice, and an id, once given, always names the same schema
//!   (ids are never deleted, so data written with them stays readable).
//! - A version node is created only after the compatibility check passed, with a create that
//!   fails if another instance took the version number first (the loser re-checks). A
//!   rejected request writes nothing, with one exception: a registration that lost such a
//!   race and then fails the re-check leaves the id it took allocated (in no subject), since
//!   another instance may already have found that id by the schema's fingerprint.

pub mod api;
mod auth;
pub mod client;
pub mod compat;
pub mod datum;
pub mod framing;
pub mod schema;
pub mod store;

pub use api::{router, run, secured_router, RegistryConfig};
pub use client::{ClientSecurity, Decoded, RegistryClient};
pub use compat::CompatibilityLevel;
pub use schema::{ParsedSchema, SchemaLimits};
pub use store::SchemaStore;

/// Everything that can fail in the registry, its storage, its client and the framing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The schema text is not valid Avro (REST 422 / 42201); carries the parser's message.
    #[error("Invalid schema: {0}")]
    InvalidSchema(String),
    /// A schema beyond one of the [`SchemaLimits`] (REST 422 / 42201): which bound, by how
    /// much, and the config key that sets it.
    #[error("Invalid schema: its {what} is {actual}, over the limit of {limit} (config key {key})")]
    SchemaLimit {
        /// What was measured.
        what: &'static str,
        /// The schema's value (for nesting depth: the depth at which the walk stopped).
        actual: usize,
        /// The bound in force.
        limit: usize,
        /// The [`RegistryConfig`] key that sets the bound.
        key: &'static str,
    },
    /// The compatibility check of two schemas would take more than its bound (REST 422 /
    /// 42201). The bound is linear in the two schemas' sizes; only schemas that pit many
    /// named types of one name against each other (in different namespaces) reach it.
    #[error("Invalid schema: checking compatibility with version {version} needs more than {bound} {unit}")]
    CheckTooComplex {
        /// The version being checked against.
        version: i32,
        /// The bound that was reached.
        bound: usize,
        /// What was counted: "steps" or "levels of nesting".
        unit: &'static str,
    },
    /// A schema type other than AVRO, or schema references, which this registry does not serve.
    #[error("Invalid schema: {0}")]
    UnsupportedSchema(String),
    /// No live version in the subject (REST 404 / 40401).
    #[error("Subject '{0}' not found.")]
    SubjectNotFound(String),
    /// The subject has no such version (REST 404 / 40402).
    #[error("Version {version} not found.")]
    VersionNotFound {
        /// Subject asked for.
        subject: String,
        /// Version asked for.
        version: i32,
    },
    /// The schema is not registered under the subject (REST 404 / 40403).
    #[error("Schema not found")]
    SchemaNotFound,
    /// No schema has this global id (REST 404 / 40403; framing: unknown id).
    #[error("Schema {0} not found")]
    UnknownId(i32),
    /// A soft delete of a subject whose versions are all soft-deleted already (REST 404 / 40404).
    #[error("Subject '{0}' was soft deleted. Set permanent=true to delete permanently")]
    SubjectSoftDeleted(String),
    /// A soft delete of a version that is soft-deleted already (REST 404 / 40406).
    #[error("Subject '{subject}' Version {version} was soft deleted. Set permanent=true to delete permanently")]
    VersionSoftDeleted {
        /// Subject.
        subject: String,
        /// Version.
        version: i32,
    },
    /// A permanent delete of a subject that was not soft-deleted first (REST 404 / 40405).
    #[error("Subject '{0}' was not deleted first before being permanently deleted")]
    SubjectNotSoftDeleted(String),
    /// A permanent delete of a version that was not soft-deleted first (REST 404 / 40407).
    #[error("Subject '{subject}' Version {version} was not deleted first before being permanently deleted")]
    VersionNotSoftDeleted {
        /// Subject.
        subject: String,
        /// Version.
        version: i32,
    },
    /// The subject has no compatibility level of its own (REST 404 / 40408).
    #[error("Subject '{0}' does not have subject-level compatibility configured")]
    SubjectConfigNotFound(String),
    /// A version that is neither a positive integer nor `latest` (REST 422 / 42202).
    #[error(
        "The specified version '{0}' is not a valid version id. Allowed values are between [1, 2^31-1] and the string \"latest\""
    )]
    InvalidVersion(String),
    /// An unknown compatibility level name (REST 422 / 42203).
    #[error("Invalid compatibility level. Valid values are none, backward, forward, full, backward_transitive, forward_transitive, and full_transitive: {0}")]
    InvalidCompatibilityLevel(String),
    /// The new schema breaks the subject's compatibility level (REST 409 / 409).
    #[error("Schema being registered is incompatible with an earlier schema for subject \"{subject}\" ({level}): {}", messages.join("; "))]
    Incompatible {
        /// Subject.
        subject: String,
        /// The level that was enforced.
        level: CompatibilityLevel,
        /// One message per failed rule, naming the version, the rule and the path.
        messages: Vec<String>,
    },
    /// The metadata store failed (REST 500 / 50001).
    #[error("Error in the backend data store: {0}")]
    Store(#[from] fjord_coord::Error),
    /// A registry node holds something this code did not write (REST 500 / 50001).
    #[error("Error in the backend data store: corrupt node {path}: {detail}")]
    Corrupt {
        /// Node path.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// Other instances kept winning the race for the same node (REST 500 / 50001).
    #[error("Error in the backend data store: too much contention on {0}, try again")]
    Contention(String),
    /// A task on the blocking pool (a parse or a check) failed to complete (REST 500 / 50001).
    #[error("internal error in a background task: {0}")]
    BackgroundTask(String),
    /// All schema ids are used up (REST 500 / 50001).
    #[error("Error in the backend data store: schema ids exhausted")]
    IdsExhausted,
    /// A [`RegistryConfig`] setting that cannot work.
    #[error("invalid registry config: {0}")]
    Config(String),
    /// Serving the REST API failed (bind, accept).
    #[error("registry server: {0}")]
    Serve(#[source] std::io::Error),
    /// Payload shorter than the 5-byte header.
    #[error("framed payload is {len} bytes, shorter than the 5-byte header (magic byte + schema id)")]
    ShortPayload {
        /// Bytes received.
        len: usize,
    },
    /// Payload does not start with magic byte 0.
    #[error("framed payload starts with magic byte {0}, expected 0")]
    BadMagic(u8),
    /// The datum decoded but bytes were left over: the payload was not written with this schema.
    #[error("framed payload with schema {schema_id} has {len} bytes after the Avro datum")]
    TrailingBytes {
        /// Schema id in the header.
        schema_id: i32,
        /// Bytes left.
        len: usize,
    },
    /// An Avro datum that breaks a decoding bound or is cut short: a length, size or item
    /// count larger than the bytes left, nesting deeper than the limit, too many values.
    #[error("Avro datum refused at byte {at}: {reason}")]
    BadDatum {
        /// Offset in the datum where the walk stopped.
        at: usize,
        /// What is wrong there.
        reason: String,
    },
    /// Avro encoding or decoding failed (the value does not match the schema, or the bytes
    /// are not a datum of the schema).
    #[error("avro: {0}")]
    Avro(#[source] Box<apache_avro::Error>),
    /// HTTP transport to the registry failed.
    #[error("registry request to {url} failed: {source}")]
    Http {
        /// URL requested.
        url: String,
        /// Transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The registry answered with an error document.
    #[error("registry answered {status} (error code {error_code}): {message}")]
    Registry {
        /// HTTP status.
        status: u16,
        /// Confluent error code.
        error_code: i32,
        /// Message.
        message: String,
    },
    /// A registry base URL that cannot be used.
    #[error("bad registry URL {0:?}")]
    BadUrl(String),
    /// A request to an `https://` registry failed in transport (connect, TLS, HTTP).
    #[error("registry request to {url} failed: {reason}")]
    Https {
        /// URL requested.
        url: String,
        /// What failed.
        reason: String,
    },
    /// The client's TLS settings for an `https://` registry cannot be used.
    #[error("registry TLS {}: {reason}", path.display())]
    Tls {
        /// The CA file (empty when none was given).
        path: std::path::PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl From<apache_avro::Error> for Error {
    fn from(e: apache_avro::Error) -> Self {
        Self::Avro(Box::new(e))
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// CPU time of the calling thread, for tests that bound what a parse, check or decode costs
/// whatever else the machine runs.
#[cfg(test)]
pub(crate) fn thread_cpu() -> std::time::Duration {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).expect("thread CPU clock");
    std::time::Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}
