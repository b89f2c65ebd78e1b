//! Authentication and authorization for Fjord, as Kafka does them: who a client is
//! ([`Principal`]), how it proves it (SASL [SCRAM](scram) and [PLAIN](plain) against
//! salted credentials), and what it may do (Kafka's [ACL model](acl) and the
//! [`Authorizer`]).
//!
//! # Layout
//! - [`principal`]: `User:<name>`, parsed and printed as Kafka does.
//! - [`scram`]: SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677): credential derivation
//!   ([`ScramCredential`]) and the server side of the exchange ([`ScramServer`]), sans-I/O.
//! - [`plain`]: SASL PLAIN (RFC 4616), checked against the same SCRAM credential.
//! - [`acl`]: resources, operations, permissions, bindings and Kafka's binding filters.
//! - [`authorizer`]: the pure, indexed check run on every request.
//! - [`store`]: credentials and ACLs in the metadata store (paths and JSON as Kafka's).
//! - [`watcher`]: [`AclWatcher`], which keeps every broker's [`Authorizer`] current.
//! - [`http`]: TLS, HTTP Basic and ACLs for the gateway and the registry.
//! - [`tls`]: the server side of TLS from PEM files (`ssl.keystore.location` ...), reloaded
//!   when the files change, and client-certificate principals; shared by the broker,
//!   the gateway and the registry.
//!
//! # Invariants
//! A password is never stored or logged: only the salt, iteration count, StoredKey and
//! ServerKey of RFC 5802 are, and PLAIN derives from those. Authorization is a pure
//! function of an immutable [`Authorizer`] snapshot; changes build a new snapshot.

pub mod acl;
pub mod authorizer;
pub mod http;
pub mod plain;
pub mod principal;
pub mod scram;
pub mod store;
pub mod tls;
pub mod watcher;

pub use acl::{
    AccessControlEntry, AclBinding, AclBindingFilter, Operation, PatternType, Permission, ResourcePattern, ResourceType,
};
pub use authorizer::{Authorizer, AuthorizerConfig, Resource};
pub use principal::Principal;
pub use scram::{ScramClient, ScramCredential, ScramMechanism, ScramServer};
pub use watcher::AclWatcher;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A SASL message does not follow its grammar.
    #[error("malformed {message} message: {reason}")]
    Malformed {
        /// Which message (`client-first`, `client-final`, `PLAIN`).
        message: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The client asked for channel binding (`y` or `p=` in the GS2 header), or its
    /// client-final binding does not repeat the client-first header. Only `n,,` is supported.
    #[error("unsupported channel binding: only `n` (no channel binding) is supported")]
    ChannelBinding,
    /// An authorization identity other than the authenticated user was requested.
    #[error("authorization id {authzid:?} differs from the user name")]
    AuthzidMismatch {
        /// The requested authorization identity.
        authzid: String,
    },
    /// The client-final nonce is not the one of this exchange (a replay from another
    /// exchange, or a broken client).
    #[error("nonce mismatch in client-final message")]
    NonceMismatch,
    /// A message arrived in a state that does not expect it (out of order, repeated,
    /// or after the exchange finished or failed).
    #[error("unexpected SASL message: the exchange is {state}")]
    UnexpectedMessage {
        /// What the exchange was waiting for.
        state: &'static str,
    },
    /// Wrong password, or no such user: deliberately the same error, so a client cannot
    /// tell which (Kafka's wording).
    #[error("authentication failed: invalid credentials")]
    AuthenticationFailed,
    /// A SASL mechanism this crate does not implement.
    #[error("unsupported SASL mechanism {0:?}")]
    UnknownMechanism(String),
    /// Fewer SCRAM iterations than the mechanism's minimum (4096, as Kafka), or more than we accept.
    #[error("SCRAM iterations {iterations} out of range {min}..={max}")]
    InvalidIterations {
        /// Requested count.
        iterations: u32,
        /// The mechanism's minimum.
        min: u32,
        /// The maximum accepted.
        max: u32,
    },
    /// A stored SCRAM credential is not `salt=..,stored_key=..,server_key=..,iterations=..`.
    #[error("invalid stored SCRAM credential: {0}")]
    InvalidCredential(&'static str),
    /// A principal is not `<type>:<name>` with both parts non-empty.
    #[error("invalid principal {0:?}: expected `User:<name>`")]
    InvalidPrincipal(String),
    /// A user name that cannot be stored (empty, or not a single store path component).
    #[error("invalid user name {0:?}")]
    InvalidUserName(String),
    /// An ACL or ACL filter field with a value Kafka's model does not have.
    #[error("invalid ACL {field}: {value:?}")]
    InvalidAcl {
        /// Which field (`resource type`, `operation`, ...).
        field: &'static str,
        /// The rejected value.
        value: String,
    },
    /// A store node kept changing under a read-modify-write; nothing was written.
    #[error("gave up updating {path}: other writers kept changing it")]
    Contended {
        /// Store path.
        path: String,
    },
    /// A setting that cannot be used: a TLS file that does not load, a key that is
    /// missing for what the others ask for.
    #[error("invalid config {key} = {value:?}: {reason}")]
    InvalidConfig {
        /// The config key.
        key: String,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The metadata store failed.
    #[error(transparent)]
    Store(#[from] fjord_coord::Error),
    /// A stored document is not the JSON it should be.
    #[error("bad document at {path}: {source}")]
    Codec {
        /// Store path.
        path: String,
        /// Parser error.
        #[source]
        source: serde_json::Error,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
