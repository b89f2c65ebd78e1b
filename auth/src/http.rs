//! Security of Fjord's HTTP and gRPC services (the gateway, the schema registry): TLS on
//! the listener with the broker's PEM keys, HTTP Basic checked against the users' SCRAM
//! credentials in the metadata store, client certificates, and the same ACLs as the
//! brokers. Key names are Confluent's REST Proxy / Schema Registry ones where they have
//! one (`authentication.method=BASIC`, `authentication.realm`,
//! `ssl.client.authentication`) and Kafka's otherwise (`ssl.keystore.location`,
//! `authorizer.enable`, `super.users`).
//!
//! # Layout
//! - [`HttpSecurityConfig`]: the keys, their defaults and checks.
//! - [`HttpSecurity`]: the running state: the TLS acceptor, the Basic verifier and its
//!   cache, the ACL watcher; [`HttpSecurity::authenticate`] and
//!   [`HttpSecurity::authorize`] are what a service calls per request.
//! - `basic`: parsing `Authorization: Basic ...` and verifying it, the KDF on the blocking
//!   pool and a short cache of verified results.
//! - `incoming`: the accept loop: TLS handshakes run concurrently, each bounded by a
//!   timeout, so a client that sends garbage or stalls costs one task and nothing else.
//!
//! # Who a request is
//! 1. With `authentication.method=BASIC` and an `Authorization` header: the user it names,
//!    if the password derives to the user's stored SCRAM credential; otherwise 401.
//! 2. Otherwise a trusted client certificate's subject, mapped by
//!    `ssl.principal.mapping.rules` (`User:CN=...`).
//! 3. Otherwise, with `authentication.method=BASIC`: no one (401, `WWW-Authenticate`);
//!    without it `User:ANONYMOUS`, which the ACLs then judge.

mod basic;
mod incoming;

use std::sync::Arc;
use std::time::Duration;

use fjord_coord::Store;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use basic::parse_basic;
pub use incoming::{Conn, Incoming, Peer};

use crate::tls::{ClientAuth, SslConfig, TlsServer};
use crate::{AclWatcher, AuthorizerConfig, Error, Operation, Principal, Resource, Result};

/// How a service authenticates HTTP requests (`authentication.method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthenticationMethod {
    /// `NONE`: no Basic authentication; a request is its client certificate's principal,
    /// or `User:ANONYMOUS`.
    #[default]
    None,
    /// `BASIC`: HTTP Basic (RFC 7617), checked against the SCRAM credentials.
    Basic,
}

/// The security settings of an HTTP/gRPC service.
#[derive(Debug, Clone)]
pub struct HttpSecurityConfig {
    /// `ssl.*` (as the broker's): with `ssl.keystore.location` set the service speaks only
    /// TLS. `ssl.client.auth` (or Confluent's `ssl.client.authentication`) asks for client
    /// certificates, which then name the principal.
    pub ssl: SslConfig,
    /// `authentication.method`: `NONE` (default) or `BASIC`.
    pub authentication: AuthenticationMethod,
    /// `authentication.realm`: the realm in `WWW-Authenticate` (default `fjord`).
    pub realm: String,
    /// `authentication.cache.ms`: how long a verified user/password pair is trusted
    /// without deriving its key again (default 10 s; 0 = every request derives). A
    /// changed or deleted password stops working at most this long after the change.
    pub cache_ttl: Duration,
    /// `authorizer.enable`: check the ACLs (Kafka's model, the brokers' store). Off: every
    /// authenticated principal may do everything.
    pub authorizer_enable: bool,
    /// `super.users` and `allow.everyone.if.no.acl.found`, as the broker's.
    pub authorizer: AuthorizerConfig,
    /// `ssl.handshake.timeout.ms`: a TLS handshake not finished by then is dropped (10 s).
    pub handshake_timeout: Duration,
}

impl Default for HttpSecurityConfig {
    fn default() -> Self {
        Self {
            ssl: SslConfig::default(),
            authentication: AuthenticationMethod::None,
            realm: "fjord".into(),
            cache_ttl: Duration::from_secs(10),
            authorizer_enable: false,
            authorizer: AuthorizerConfig::default(),
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

impl HttpSecurityConfig {
    /// Every key [`HttpSecurityConfig::set`] takes.
    pub const KEYS: &'static [&'static str] = &[
        "ssl.keystore.type",
        "ssl.truststore.type",
        "ssl.keystore.location",
        "ssl.truststore.location",
        "ssl.client.auth",
        "ssl.client.authentication",
        "ssl.principal.mapping.rules",
        "ssl.key.password",
        "ssl.handshake.timeout.ms",
        "authentication.method",
        "authentication.realm",
        "authentication.cache.ms",
        "authorizer.enable",
        "super.users",
        "allow.everyone.if.no.acl.found",
    ];

    /// Sets one key; `Ok(false)` when `key` is not a security key, `Err` with the reason
    /// when its value is not usable.
    pub fn set(&mut self, key: &str, value: &str) -> std::result::Result<bool, String> {
        let value = value.trim();
        let millis = || value.parse::<u64>().map(Duration::from_millis).map_err(|_| "expected milliseconds".to_string());
        let flag = || value.parse::<bool>().map_err(|_| "expected true or false".to_string());
        match key {
            // Confluent's name and values (NONE, REQUESTED, REQUIRED) for Kafka's key.
            "ssl.client.authentication" => self.ssl.set("ssl.client.auth", value)?,
            _ if SslConfig::KEYS.contains(&key) => self.ssl.set(key, value)?,
            "ssl.handshake.timeout.ms" => self.handshake_timeout = millis()?,
            "authentication.method" => {
                self.authentication = match value.to_ascii_uppercase().as_str() {
                    "NONE" => AuthenticationMethod::None,
                    "BASIC" => AuthenticationMethod::Basic,
                    _ => return Err("expected NONE or BASIC".into()),
                }
            }
            "authentication.realm" if value.is_empty() || value.contains(['"', '\\']) => {
                return Err("the realm must be non-empty, without quotes or backslashes".into())
            }
            "authentication.realm" => self.realm = value.to_owned(),
            "authentication.cache.ms" => self.cache_ttl = millis()?,
            "authorizer.enable" => self.authorizer_enable = flag()?,
            "super.users" => {
                self.authorizer.super_users = AuthorizerConfig::parse_super_users(value).map_err(|e| e.to_string())?
            }
            "allow.everyone.if.no.acl.found" => self.authorizer.allow_everyone_if_no_acl_found = flag()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Whether the listeners speak TLS.
    pub fn tls_enabled(&self) -> bool {
        self.ssl.keystore_location.is_some()
    }

    /// Whether the service needs the metadata store (users for Basic, or ACLs).
    pub fn needs_store(&self) -> bool {
        self.authentication == AuthenticationMethod::Basic || self.authorizer_enable
    }

    /// Rejects settings that cannot work together.
    pub fn validate(&self) -> Result<()> {
        let invalid =
            |key: &str, reason: &str| Error::InvalidConfig { key: key.into(), value: String::new(), reason: reason.into() };
        if self.ssl.client_auth != ClientAuth::None && !self.tls_enabled() {
            return Err(invalid("ssl.client.auth", "client certificates need TLS: set ssl.keystore.location"));
        }
        if self.handshake_timeout.is_zero() {
            return Err(invalid("ssl.handshake.timeout.ms", "must be positive"));
        }
        Ok(())
    }
}

/// The running security of one service; share it as `Arc<HttpSecurity>`.
pub struct HttpSecurity {
    config: HttpSecurityConfig,
    tls: Option<TlsServer>,
    basic: Option<basic::BasicVerifier>,
    acls: Option<Arc<AclWatcher>>,
}

impl std::fmt::Debug for HttpSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSecurity")
            .field("tls", &self.tls.is_some())
            .field("authentication", &self.config.authentication)
            .field("authorizer", &self.acls.is_some())
            .finish()
    }
}

/// Why a request is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unauthenticated {
    /// Credentials are required and none came.
    Missing,
    /// The `Authorization` header is not `Basic <base64 of user:password>`, or is too long.
    Malformed(&'static str),
    /// Wrong password or no such user (deliberately the same).
    Failed,
    /// The store could not be read; the request may be retried.
    Unavailable(String),
}

impl std::fmt::Display for Unauthenticated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing => f.write_str("authentication required: send HTTP Basic credentials or a client certificate"),
            Self::Malformed(why) => write!(f, "malformed Authorization header: {why}"),
            Self::Failed => f.write_str("authentication failed: invalid credentials"),
            Self::Unavailable(why) => write!(f, "credentials could not be checked: {why}"),
        }
    }
}

impl HttpSecurity {
    /// Loads the TLS files and, when Basic or the authorizer is on, starts reading users
    /// and ACLs from `store` (an ACL watcher on `tracker`, until `shutdown`). A bad file or
    /// a missing store is an error here, not at the first request.
    pub async fn start(
        config: HttpSecurityConfig,
        store: Option<Store>,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>> {
        config.validate()?;
        // HTTP/2 (gRPC's transport) and HTTP/1.1, both served on each listener.
        let alpn = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let tls = if config.tls_enabled() { Some(TlsServer::with_alpn(config.ssl.clone(), alpn)?) } else { None };
        let store = match (config.needs_store(), store) {
            (false, _) => None,
            (true, Some(store)) => Some(store),
            (true, None) => {
                return Err(Error::InvalidConfig {
                    key: "authentication.method".into(),
                    value: format!("{:?}", config.authentication),
                    reason: "Basic authentication and the authorizer read users and ACLs from the metadata store: give one (--zookeeper or the embedded store)".into(),
                })
            }
        };
        let basic = match (&config.authentication, &store) {
            (AuthenticationMethod::Basic, Some(store)) => Some(basic::BasicVerifier::new(store.clone(), config.cache_ttl)),
            _ => None,
        };
        let acls = match (config.authorizer_enable, store) {
            (true, Some(store)) => Some(AclWatcher::start(store, config.authorizer.clone(), tracker, shutdown).await?),
            _ => None,
        };
        Ok(Arc::new(Self { config, tls, basic, acls }))
    }

    /// No TLS, no authentication, no authorization: everyone is `User:ANONYMOUS` and may
    /// do everything.
    pub fn open() -> Arc<Self> {
        Arc::new(Self { config: HttpSecurityConfig::default(), tls: None, basic: None, acls: None })
    }

    /// The settings.
    pub fn config(&self) -> &HttpSecurityConfig {
        &self.config
    }

    /// The TLS server, when the listeners speak TLS.
    pub fn tls(&self) -> Option<&TlsServer> {
        self.tls.as_ref()
    }

    /// Whether a request without credentials is refused (Basic is on).
    pub fn requires_credentials(&self) -> bool {
        self.basic.is_some()
    }

    /// The `WWW-Authenticate` value of a 401 (RFC 7617).
    pub fn www_authenticate(&self) -> String {
        format!("Basic realm=\"{}\", charset=\"UTF-8\"", self.config.realm)
    }

    /// Who a request is: see the module docs. `authorization` is the raw header value.
    pub async fn authenticate(&self, authorization: Option<&[u8]>, peer: &Peer) -> Result<Principal, Unauthenticated> {
        if let (Some(header), Some(basic)) = (authorization, &self.basic) {
            return basic.verify(header).await;
        }
        if let Some(principal) = &peer.certificate_principal {
            return Ok(principal.clone());
        }
        if self.basic.is_some() {
            return Err(Unauthenticated::Missing);
        }
        Ok(Principal::anonymous())
    }

    /// Whether `principal`, from `host`, may do `operation` on `resource`; always true
    /// with the authorizer off.
    pub fn authorize(&self, principal: &Principal, host: &str, operation: Operation, resource: Resource<'_>) -> bool {
        self.acls.as_ref().is_none_or(|acls| acls.authorize(principal, host, operation, resource))
    }

    /// Whether the authorizer is on.
    pub fn authorizer_enabled(&self) -> bool {
        self.acls.is_some()
    }
}
