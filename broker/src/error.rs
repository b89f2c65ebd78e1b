//! The broker's error type: what can stop the broker or a connection. Per-request
//! failures never become an [`Error`]; they are answered with a Kafka error code.

use std::path::PathBuf;

/// Why the broker (or one of its connections) stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration key this broker does not know.
    #[error("unknown config key `{key}`")]
    UnknownConfig {
        /// The key as given.
        key: String,
    },
    /// A configuration value that does not parse or is out of range.
    #[error("invalid value `{value}` for config `{key}`: {reason}")]
    InvalidConfig {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TOML config file does not parse.
    #[error("config file does not parse: {0}")]
    ConfigFile(#[from] toml::de::Error),
    /// The storage engine failed.
    #[error("log: {0}")]
    Log(#[from] fjord_log::Error),
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Coord(#[from] fjord_coord::Error),
    /// A metadata record in the store does not parse.
    #[error("metadata at {path} does not parse: {source}")]
    Metadata {
        /// Store path.
        path: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// The producer id block in the store is unusable (bounds that are not numbers,
    /// or no ids left).
    #[error("producer id block at {path}: {reason}")]
    ProducerIdBlock {
        /// Store path.
        path: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A file in the log dir (meta.properties) could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `meta.properties` belongs to another broker or is malformed.
    #[error("{}: {reason}", path.display())]
    MetaProperties {
        /// The file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// The log dir's `meta.properties` names another cluster than the metadata store
    /// (Kafka's `InconsistentClusterIdException`): the broker is pointed at the wrong
    /// cluster, or its log dir is another cluster's.
    #[error(
        "the cluster id {cluster} in the metadata store does not match the cluster id {stored} in {}: this broker is \
         trying to join the wrong cluster (is zookeeper.connect or the data dir wrong?). If the log dir is meant for this \
         cluster (brokers upgraded from a Fjord that gave each one its own id), remove the cluster.id line and restart",
        path.display()
    )]
    InconsistentClusterId {
        /// The `meta.properties` file.
        path: PathBuf,
        /// The id in it.
        stored: String,
        /// The id in the metadata store.
        cluster: String,
    },
    /// Socket I/O on a connection or the listener.
    #[error("network: {0}")]
    Network(#[source] std::io::Error),
    /// A client sent bytes that are not a Kafka request; its connection is closed.
    #[error("malformed request from client: {0}")]
    Protocol(String),
    /// A request frame larger than `socket.request.max.bytes`; the connection is closed.
    #[error("request frame of {size} bytes exceeds socket.request.max.bytes = {max}")]
    FrameTooLarge {
        /// Announced frame size.
        size: i64,
        /// The limit.
        max: usize,
    },
    /// A SASL session passed `connections.max.reauth.ms` without re-authenticating and
    /// sent another request; its connection is closed (the client reconnects).
    #[error("SASL session expired (connections.max.reauth.ms) before a {api} request")]
    SessionExpired {
        /// The request that found the session expired.
        api: String,
    },
    /// A connection sent no request for `connections.max.idle.ms`; it is closed.
    #[error("no request for {idle:?} (connections.max.idle.ms)")]
    ConnectionIdle {
        /// The limit.
        idle: std::time::Duration,
    },
    /// A client that did not authenticate: it failed, stalled, or sent another request
    /// first. Its connection is closed.
    #[error("authentication: {reason}")]
    Unauthenticated {
        /// What happened.
        reason: String,
    },
    /// The ACLs could not be read at start (`authorizer.enable`).
    #[error("reading the ACLs: {0}")]
    Acls(#[from] fjord_auth::Error),
    /// A metadata node kept changing under a compare-and-set write.
    #[error("{path} kept changing under concurrent writes; retry")]
    Contended {
        /// Store path.
        path: String,
    },
    /// A background task panicked or was cancelled unexpectedly.
    #[error("background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
