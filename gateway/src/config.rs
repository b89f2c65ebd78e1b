//! [`GatewayConfig`]: every setting of the gateway, with its default declared once here.

use std::time::Duration;

use fjord_auth::http::HttpSecurityConfig;
use fjord_client::SecurityConfig;

use crate::{Error, Result};

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// `bootstrap.servers` of the cluster the gateway publishes into (comma-separated).
    pub bootstrap: String,
    /// Base URL of the schema registry (`http://host:8081`); `None` disables Avro.
    pub registry_url: Option<String>,
    /// Largest HTTP request body; larger ones get 413 before being parsed.
    pub max_body_bytes: usize,
    /// Largest single event (key + value + headers); larger ones are refused with the
    /// record's index before anything of the request is produced.
    pub max_event_bytes: usize,
    /// Bytes of events accepted but not yet acknowledged, over all requests. A request
    /// that would go past it is refused with 429 / RESOURCE_EXHAUSTED.
    pub buffer_bytes: usize,
    /// What a refused caller is told to wait (`Retry-After`).
    pub retry_after: Duration,
    /// Bound on waiting for the brokers (connect, metadata, acknowledgement): past it the
    /// answer is 503 / UNAVAILABLE, never a hang.
    pub broker_timeout: Duration,
    /// `linger.ms` of the shared producer: how long a partition's batch waits for events
    /// from other requests before it is sent. Default 0: under load batches still fill,
    /// since a partition's open batch waits while two of its batches are in flight, and
    /// an idle gateway does not add a linger to every answer.
    pub linger: Duration,
    /// `batch.size` of the shared producer.
    pub batch_bytes: usize,
    /// Upper bound on `max_bytes` of a fetch.
    pub max_fetch_bytes: usize,
    /// Upper bound on `max_wait_ms` of a fetch.
    pub max_fetch_wait: Duration,
    /// Value of the `fjord.host` header stamped on events; `None` = this machine's hostname.
    pub host_name: Option<String>,
    /// How often the gateway tier's audit counts (events acknowledged, per topic and
    /// window of creation time) are published to `_audit`; `None` = no audit counting.
    pub audit_interval: Option<Duration>,
    /// Audit window length; every tier and the report must use the same.
    pub audit_window: Duration,
    /// Datacenter / cluster name written into the gateway's audit records.
    pub audit_cluster: String,
    /// The web console's `/ui/mirror`: the mirror's metrics address, for its sources'
    /// state (`console.mirror.url`).
    pub console_mirror_url: Option<String>,
    /// Mirror groups besides `fjord-mirror` (`console.mirror.groups`, comma-separated).
    pub console_mirror_groups: Vec<String>,
    /// The web console's `/ui/loads`: destinations of `fjord load` jobs (`console.loads`,
    /// comma-separated `file:///dir` or `hdfs://host:port/dir`).
    pub console_loads: Vec<String>,
    /// Where `?on_invalid=dead_letter` puts invalid events; `None` = `<topic>.dlq`.
    pub dead_letter_topic: Option<String>,
    /// Which browser origins may call the HTTP front (CORS), and to which topics.
    pub cors: CorsConfig,
    /// How long an `Idempotency-Key` holds: a repeat within it gets the first answer and
    /// writes nothing. Also the retention of the key topic.
    pub idempotency_window: Duration,
    /// `transactional.id` of the producer behind atomic publishes; `None` =
    /// `fjord-gateway-<host name>`. Keep it per gateway and stable across its restarts:
    /// a restart then fences the previous process and aborts what it left open.
    pub transactional_id: Option<String>,
    /// Requests/s and bytes/s per client (principal, or IP address when anonymous);
    /// off by default.
    pub client_limits: ClientLimits,
    /// TLS, authentication and authorization of the HTTP and gRPC fronts: Confluent REST
    /// Proxy's and Kafka's keys (`ssl.keystore.location`, `authentication.method=BASIC`,
    /// `authorizer.enable` ...; see [`GatewayConfig::set`]).
    pub security: HttpSecurityConfig,
    /// How the gateway connects to the brokers: its own identity, as Confluent REST Proxy's
    /// `client.*` keys (`client.security.protocol`, `client.sasl.mechanism`,
    /// `client.sasl.username`, `client.sasl.password`, `client.ssl.ca.location`,
    /// `client.ssl.certificate.location`, `client.ssl.key.location`).
    pub client_security: SecurityConfig,
    /// How the gateway reaches an `https://` registry and who it is there, as REST
    /// Proxy's `schema.registry.*` keys (`schema.registry.ssl.ca.location`,
    /// `schema.registry.basic.auth.user.info`).
    pub registry_security: fjord_schema_registry::ClientSecurity,
}

/// Per-client rate limits (see `limits`): over either, a request is refused with 429 and
/// `Retry-After` (gRPC: RESOURCE_EXHAUSTED with `grpc-retry-pushback-ms`). A client is its
/// authenticated principal (Basic or client certificate), or its IP address when
/// anonymous, so anonymous beacons from many browsers do not share one allowance. Limits
/// are per gateway process: behind a load balancer over N gateways a client gets up to N
/// times them, and anonymous clients behind one proxy share its address.
#[derive(Debug, Clone)]
pub struct ClientLimits {
    /// Requests per second per client on the data routes (publish, pull, topics) and per
    /// gRPC publish batch or fetch; 0 = unlimited.
    pub requests_per_sec: u32,
    /// Request body bytes per second per client, as sent (compressed bodies count
    /// compressed, like Kafka's produce quotas; gRPC: the events' size); 0 = unlimited.
    pub bytes_per_sec: u64,
    /// How much of a second's allowance a client may spend at once: each bucket holds
    /// `rate x burst`.
    pub burst: Duration,
    /// Clients tracked at once; past it idle clients, then the least recently seen, are
    /// forgotten, so memory stays bounded under many distinct clients.
    pub max_clients: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self { requests_per_sec: 0, bytes_per_sec: 0, burst: Duration::from_secs(1), max_clients: 100_000 }
    }
}

/// CORS for browsers. With no allowed origins CORS is off: no CORS headers, preflights
/// refused, and requests without `Origin` (servers, curl) are unaffected either way.
/// With origins listed, a request from any other origin is refused with 403, so a page
/// elsewhere cannot publish even with `sendBeacon` (which needs no preflight).
#[derive(Debug, Clone)]
pub struct CorsConfig {
    /// `https://app.example.com`, `http://localhost:*` (any port) or `*` (any origin).
    pub allowed_origins: Vec<String>,
    /// Methods a preflight may ask for.
    pub allowed_methods: Vec<String>,
    /// Request headers a preflight may ask for (case-insensitive).
    pub allowed_headers: Vec<String>,
    /// How long a browser may cache a preflight answer (`Access-Control-Max-Age`).
    pub max_age: Duration,
    /// Per-origin topic allow-list: `(origin pattern, topics)`, a topic being a name or a
    /// prefix ending in `*`. An origin matching an entry may use only its topics; an
    /// origin matching none may use every topic.
    pub origin_topics: Vec<(String, Vec<String>)>,
}

impl Default for CorsConfig {
    fn default() -> Self {
        Self {
            allowed_origins: Vec::new(),
            allowed_methods: vec!["GET".into(), "POST".into(), "OPTIONS".into()],
            allowed_headers: ["content-type", "content-encoding", "idempotency-key", "authorization"].map(String::from).into(),
            max_age: Duration::from_secs(600),
            origin_topics: Vec::new(),
        }
    }
}

impl CorsConfig {
    /// The origins `fjord dev` allows: pages served from this machine on any port.
    pub fn loopback() -> Self {
        Self { allowed_origins: vec!["http://localhost:*".into(), "http://127.0.0.1:*".into()], ..Self::default() }
    }

    /// CORS is on when an origin is listed.
    pub fn enabled(&self) -> bool {
        !self.allowed_origins.is_empty()
    }

    /// Whether `origin` (as the browser sent it) matches a listed origin.
    pub fn allows(&self, origin: &str) -> bool {
        self.allowed_origins.iter().any(|p| origin_matches(p, origin))
    }

    /// Whether `origin` may use `topic` under the per-origin allow-list.
    pub fn allows_topic(&self, origin: &str, topic: &str) -> bool {
        let mut listed = self.origin_topics.iter().filter(|(p, _)| origin_matches(p, origin)).peekable();
        if listed.peek().is_none() {
            return true;
        }
        listed.any(|(_, topics)| {
            topics.iter().any(|t| match t.strip_suffix('*') {
                Some(prefix) => topic.starts_with(prefix),
                None => t == topic,
            })
        })
    }
}

impl CorsConfig {
    /// Rejects origin patterns a browser would never send, which would otherwise silently
    /// match nothing.
    pub fn validate(&self) -> Result<()> {
        let patterns = self.allowed_origins.iter().chain(self.origin_topics.iter().map(|(o, _)| o));
        for p in patterns {
            let scheme_host = p.starts_with("http://") || p.starts_with("https://");
            if (p != "*" && !scheme_host) || p.ends_with('/') {
                return Err(Error::Config(format!(
                    "CORS origin {p:?} must be *, or scheme://host[:port] with no path (e.g. http://localhost:*)"
                )));
            }
        }
        Ok(())
    }
}

/// `pattern` is `*`, an exact origin, or `scheme://host:*` for any port (or none).
/// Scheme and host compare case-insensitively, as browsers serialise them lower-case.
pub(crate) fn origin_matches(pattern: &str, origin: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let (pattern, origin) = (pattern.to_ascii_lowercase(), origin.to_ascii_lowercase());
    match pattern.strip_suffix(":*") {
        Some(base) => match origin.strip_prefix(base) {
            Some("") => true,
            Some(rest) => rest.strip_prefix(':').is_some_and(|port| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())),
            None => false,
        },
        None => pattern == origin,
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            bootstrap: "127.0.0.1:9092".into(),
            registry_url: None,
            max_body_bytes: 10 * 1024 * 1024,
            // The client's default max.request.size less batch overhead: one event must
            // fit one produce request.
            max_event_bytes: 1024 * 1024 - 1024,
            buffer_bytes: 64 * 1024 * 1024,
            retry_after: Duration::from_secs(1),
            broker_timeout: Duration::from_secs(10),
            // 5 ms (Kafka's default since 4.0) held every answer that long when the
            // gateway was not busy: 32 callers posting one event at a time got 4.7k
            // events/s at p50 6.8 ms, against 32k-35k at 0.8-0.9 ms with 0; with 500-event
            // requests throughput was the same. What 0 costs: fewer events per produce
            // request, 0.28-0.35 against 0.18-0.23 µs of broker CPU per event with
            // 20-event requests from 64 callers (gateway_bench, alternated runs).
            linger: Duration::ZERO,
            batch_bytes: 256 * 1024,
            max_fetch_bytes: 8 * 1024 * 1024,
            max_fetch_wait: Duration::from_secs(30),
            host_name: None,
            audit_interval: None,
            audit_window: Duration::from_millis(fjord_audit::DEFAULT_WINDOW_MS as u64),
            audit_cluster: "default".into(),
            console_mirror_url: None,
            console_mirror_groups: Vec::new(),
            console_loads: Vec::new(),
            dead_letter_topic: None,
            cors: CorsConfig::default(),
            idempotency_window: Duration::from_secs(24 * 60 * 60),
            transactional_id: None,
            client_limits: ClientLimits::default(),
            security: HttpSecurityConfig::default(),
            client_security: SecurityConfig::default(),
            registry_security: fjord_schema_registry::ClientSecurity::default(),
        }
    }
}

impl GatewayConfig {
    /// A config publishing into `bootstrap`, defaults elsewhere.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        Self { bootstrap: bootstrap.into(), ..Self::default() }
    }

    /// Sets a key by its name, as in a Confluent REST Proxy properties file: security keys,
    /// the front's own (`ssl.keystore.location`, `ssl.truststore.location`,
    /// `ssl.client.auth` or `ssl.client.authentication`, `ssl.principal.mapping.rules`,
    /// `ssl.handshake.timeout.ms`, `authentication.method` (`NONE`|`BASIC`),
    /// `authentication.realm`, `authentication.cache.ms`, `authorizer.enable`,
    /// `super.users`, `allow.everyone.if.no.acl.found`) and the brokers' connection
    /// (`client.` + a Kafka client security key), the registry's
    /// (`schema.registry.ssl.ca.location`, `schema.registry.basic.auth.user.info`); and the gateway's own
    /// `idempotency.window.ms`, `transactional.id`, `limits.requests.per.sec`, `limits.bytes.per.sec`,
    /// `limits.burst.ms` and `limits.max.clients`; the web console's `console.mirror.url`,
    /// `console.mirror.groups` and `console.loads`. An unknown key is an error.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let bad = |reason: String| Error::Config(format!("{key}: {reason}"));
        let number = || value.trim().parse::<u64>().map_err(|_| bad(format!("{value:?} is not a whole number")));
        let too_large = |_| bad("too large".into());
        let list = |v: &str| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect::<Vec<_>>();
        match key {
            "idempotency.window.ms" => self.idempotency_window = Duration::from_millis(number()?),
            "transactional.id" => self.transactional_id = Some(value.trim().to_string()),
            "limits.requests.per.sec" => self.client_limits.requests_per_sec = u32::try_from(number()?).map_err(too_large)?,
            "limits.bytes.per.sec" => self.client_limits.bytes_per_sec = number()?,
            "limits.burst.ms" => self.client_limits.burst = Duration::from_millis(number()?),
            "limits.max.clients" => self.client_limits.max_clients = usize::try_from(number()?).map_err(too_large)?,
            "console.mirror.url" => self.console_mirror_url = Some(value.trim().to_string()).filter(|v| !v.is_empty()),
            "console.mirror.groups" => self.console_mirror_groups = list(value),
            "console.loads" => self.console_loads = list(value),
            _ => {
                if let Some(registry_key) = key.strip_prefix("schema.registry.") {
                    return match self.registry_security.set(registry_key, value) {
                        Ok(true) => Ok(()),
                        Ok(false) => Err(bad("not a registry client key (ssl.ca.location, basic.auth.user.info)".into())),
                        Err(reason) => Err(bad(reason)),
                    };
                }
                if let Some(client_key) = key.strip_prefix("client.") {
                    return match self.client_security.set(client_key, value) {
                        Ok(true) => Ok(()),
                        Ok(false) => Err(bad("not a client security key (security.protocol, sasl.*, ssl.*.location)".into())),
                        Err(e) => Err(bad(e.to_string())),
                    };
                }
                return match self.security.set(key, value) {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(bad("unknown gateway key".into())),
                    Err(reason) => Err(bad(reason)),
                };
            }
        }
        Ok(())
    }

    /// How the gateway's own clients (producer, fetches, admin, audit, idempotency keys)
    /// reach the brokers: `bootstrap`, the broker timeout and `client.*` security.
    pub fn client_config(&self) -> fjord_client::ClientConfig {
        fjord_client::ClientConfig {
            connect_timeout: self.broker_timeout.min(Duration::from_secs(5)),
            request_timeout: self.broker_timeout,
            security: self.client_security.clone(),
            ..fjord_client::ClientConfig::new(&self.bootstrap)
        }
    }

    /// The web console's settings: the gateway's brokers, identity, registry and bounds.
    pub fn console_config(&self) -> fjord_console::ConsoleConfig {
        fjord_console::ConsoleConfig {
            client: self.client_config(),
            registry_url: self.registry_url.clone(),
            timeout: self.broker_timeout,
            audit_window: self.audit_window,
            mirror_url: self.console_mirror_url.clone(),
            mirror_groups: self.console_mirror_groups.clone(),
            loads: self.console_loads.clone(),
        }
    }

    /// Rejects settings the gateway cannot run with.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.bootstrap.split(',').all(|s| s.trim().is_empty()) {
            return bad("bootstrap is empty".into());
        }
        if self.max_event_bytes == 0 || self.max_event_bytes >= 1024 * 1024 {
            return bad(format!("max_event_bytes = {} must be in 1..1048576 (one produce request)", self.max_event_bytes));
        }
        if self.buffer_bytes < self.max_body_bytes {
            return bad(format!(
                "buffer_bytes = {} is below max_body_bytes = {}: a full-size request could never be accepted",
                self.buffer_bytes, self.max_body_bytes
            ));
        }
        if self.audit_interval.is_some_and(|i| i.is_zero()) || self.audit_window.as_millis() == 0 {
            return bad("audit_interval and audit_window must be positive".into());
        }
        self.cors.validate()?;
        if self.idempotency_window.as_millis() == 0 {
            return bad("idempotency_window must be positive".into());
        }
        if self.client_limits.burst.as_millis() == 0 || self.client_limits.max_clients == 0 {
            return bad("client_limits: burst and max_clients must be positive".into());
        }
        if self.transactional_id.as_deref().is_some_and(|id| id.is_empty() || id.len() > 249) {
            return bad("transactional_id must be 1-249 characters".into());
        }
        if self.broker_timeout.is_zero() {
            return bad("broker_timeout must be positive".into());
        }
        self.security.validate().map_err(|e| Error::Config(e.to_string()))?;
        if self.max_fetch_bytes == 0 || self.max_fetch_bytes > i32::MAX as usize {
            return bad(format!("max_fetch_bytes = {} is out of range", self.max_fetch_bytes));
        }
        Ok(())
    }

    /// The transactional id of atomic publishes (see `atomic`).
    pub(crate) fn resolved_transactional_id(&self) -> String {
        self.transactional_id.clone().unwrap_or_else(|| format!("fjord-gateway-{}", self.resolved_host_name()))
    }

    /// The `fjord.host` value: the configured name or this machine's hostname.
    pub(crate) fn resolved_host_name(&self) -> String {
        self.host_name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "unknown".into())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_settings_are_named() {
        GatewayConfig::default().validate().unwrap();
        let c = GatewayConfig { buffer_bytes: 1024, ..GatewayConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("buffer_bytes"));
        let c = GatewayConfig::new(" , ");
        assert!(c.validate().unwrap_err().to_string().contains("bootstrap"));
        assert!(!GatewayConfig::default().resolved_host_name().is_empty());
        assert_eq!(GatewayConfig { host_name: Some("h1".into()), ..GatewayConfig::default() }.resolved_host_name(), "h1");
        let c = GatewayConfig { host_name: Some("h1".into()), ..GatewayConfig::default() };
        assert_eq!(c.resolved_transactional_id(), "fjord-gateway-h1");
        let mut c = GatewayConfig::default();
        c.set("transactional.id", "gw-7").unwrap();
        assert_eq!(c.resolved_transactional_id(), "gw-7");
        c.set("transactional.id", "").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("transactional_id"));
    }

    #[test]
    fn origin_patterns_and_topic_allow_lists() {
        let c = CorsConfig {
            origin_topics: vec![("http://localhost:*".into(), vec!["web-*".into(), "beacons".into()])],
            ..CorsConfig::loopback()
        };
        assert!(c.allows("http://localhost:3000") && c.allows("http://LOCALHOST") && c.allows("http://127.0.0.1:8080"));
        for bad in ["http://localhost.evil.com", "http://localhost:", "http://localhost:80x", "https://localhost:1", "null"] {
            assert!(!c.allows(bad), "{bad}");
        }
        assert!(c.allows_topic("http://localhost:1", "web-clicks") && c.allows_topic("http://localhost:1", "beacons"));
        assert!(!c.allows_topic("http://localhost:1", "payments"));
        assert!(c.allows_topic("http://127.0.0.1:1", "payments"), "an origin not in the list may use every topic");
        assert!(!CorsConfig::default().enabled() && CorsConfig::default().validate().is_ok());
        let bad = CorsConfig { allowed_origins: vec!["localhost".into()], ..CorsConfig::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("localhost"));
    }
}
