//! Named listeners, as Kafka configures them: `listeners` binds one address per name,
//! `listener.security.protocol.map` says what each name speaks, `advertised.listeners`
//! what clients are told, and `inter.broker.listener.name` which one brokers use among
//! themselves.
//!
//! ```text
//! listeners = "INTERNAL://10.0.0.1:9093,EXTERNAL://0.0.0.0:9094"
//! listener.security.protocol.map = "INTERNAL:SSL,EXTERNAL:SASL_SSL"
//! advertised.listeners = "INTERNAL://10.0.0.1:9093,EXTERNAL://kafka.example.com:9094"
//! inter.broker.listener.name = "INTERNAL"
//! ```
//!
//! A bare `HOST:PORT` is a listener named `PLAINTEXT`, so the single-address configs
//! written before named listeners keep their meaning. Names are compared without case
//! and kept in upper case, as Kafka writes them.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection;
use crate::handler::Broker;
use crate::metrics::ConnectionEvent;
use crate::{Error, Result};

/// What a listener speaks: Kafka's four security protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SecurityProtocol {
    /// No TLS, no authentication.
    Plaintext,
    /// TLS; a client certificate (when `ssl.client.auth` asks for one) names the principal.
    Ssl,
    /// SASL authentication without TLS.
    SaslPlaintext,
    /// SASL authentication inside TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Kafka's name of the protocol.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }

    /// The protocol named `name` (any case).
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Plaintext, Self::Ssl, Self::SaslPlaintext, Self::SaslSsl]
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether the connection runs inside TLS.
    pub fn tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    /// Whether a client authenticates with SASL before anything but ApiVersions and
    /// the SASL requests is answered.
    pub fn sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Kafka's default `listener.security.protocol.map`: each protocol's name maps to itself.
pub(crate) fn default_protocol_map() -> BTreeMap<String, SecurityProtocol> {
    [SecurityProtocol::Plaintext, SecurityProtocol::Ssl, SecurityProtocol::SaslPlaintext, SecurityProtocol::SaslSsl]
        .into_iter()
        .map(|p| (p.name().to_owned(), p))
        .collect()
}

/// Parses `NAME:PROTOCOL,NAME:PROTOCOL`.
pub(crate) fn parse_protocol_map(value: &str) -> Result<BTreeMap<String, SecurityProtocol>, String> {
    let mut map = BTreeMap::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, protocol) = entry.split_once(':').ok_or_else(|| format!("`{entry}` is not NAME:PROTOCOL"))?;
        let name = listener_name(name)?;
        let protocol = SecurityProtocol::parse(protocol)
            .ok_or_else(|| format!("`{protocol}` is not a security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL)"))?;
        if map.insert(name.clone(), protocol).is_some() {
            return Err(format!("listener {name} is mapped twice"));
        }
    }
    if map.is_empty() {
        return Err("no listener is mapped".into());
    }
    Ok(map)
}

/// One entry of `listeners`: a name and the address it binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// Upper-case listener name, e.g. `PLAINTEXT` or `INTERNAL`.
    pub name: String,
    /// The address to bind.
    pub address: SocketAddr,
}

/// `listeners`: one or more named addresses, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listeners(Vec<ListenerConfig>);

impl Listeners {
    /// The listeners in configuration order (never empty).
    pub fn iter(&self) -> impl Iterator<Item = &ListenerConfig> {
        self.0.iter()
    }

    /// The first listener: the one `run` serves on the listener it is given.
    pub fn first(&self) -> &ListenerConfig {
        &self.0[0]
    }

    /// How many listeners there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: `listeners` has at least one entry.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The listener named `name` (any case).
    pub fn get(&self, name: &str) -> Option<&ListenerConfig> {
        self.0.iter().find(|l| l.name.eq_ignore_ascii_case(name))
    }
}

/// A single `PLAINTEXT` listener on `address`.
impl From<SocketAddr> for Listeners {
    fn from(address: SocketAddr) -> Self {
        Self(vec![ListenerConfig { name: SecurityProtocol::Plaintext.name().to_owned(), address }])
    }
}

impl FromStr for Listeners {
    type Err = Error;

    /// `NAME://HOST:PORT,...`, or one bare `HOST:PORT` (named `PLAINTEXT`).
    fn from_str(value: &str) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidConfig { key: "listeners".into(), value: value.to_owned(), reason };
        let mut listeners: Vec<ListenerConfig> = Vec::new();
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, address) = match entry.split_once("://") {
                Some((name, address)) => (listener_name(name).map_err(invalid)?, address),
                None => (SecurityProtocol::Plaintext.name().to_owned(), entry),
            };
            let address = resolve(address).ok_or_else(|| invalid(format!("`{entry}`: expected NAME://HOST:PORT")))?;
            if listeners.iter().any(|l| l.name == name) {
                return Err(invalid(format!("listener {name} is named twice")));
            }
            if address.port() != 0 && listeners.iter().any(|l| l.address == address) {
                return Err(invalid(format!("{address} is bound by two listeners")));
            }
            listeners.push(ListenerConfig { name, address });
        }
        if listeners.is_empty() {
            return Err(invalid("no listener given".into()));
        }
        Ok(Self(listeners))
    }
}

/// `advertised.listeners`, parsed: listener name → host and port. A bare `HOST:PORT`
/// (the form before named listeners) advertises the first listener.
pub(crate) fn parse_advertised(value: &str, listeners: &Listeners) -> Result<BTreeMap<String, (String, u16)>, String> {
    let mut advertised = BTreeMap::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, address) = match entry.split_once("://") {
            Some((name, address)) => (listener_name(name)?, address),
            None => (listeners.first().name.clone(), entry),
        };
        let (host, port) = split_host_port(address).ok_or_else(|| format!("`{entry}`: expected NAME://HOST:PORT"))?;
        if listeners.get(&name).is_none() {
            return Err(format!("{name} is not one of the listeners"));
        }
        if advertised.insert(name.clone(), (host.to_owned(), port)).is_some() {
            return Err(format!("listener {name} is advertised twice"));
        }
    }
    Ok(advertised)
}

/// A listener as a running broker serves it: name, protocol and what clients are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListenerInfo {
    pub(crate) name: String,
    pub(crate) protocol: SecurityProtocol,
    /// Advertised host and port.
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl ListenerInfo {
    /// `NAME://host:port`, as registered in `endpoints`.
    pub(crate) fn endpoint(&self) -> String {
        if self.host.contains(':') {
            format!("{}://[{}]:{}", self.name, self.host, self.port)
        } else {
            format!("{}://{}:{}", self.name, self.host, self.port)
        }
    }
}

fn listener_name(name: &str) -> Result<String, String> {
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(format!("`{name}` is not a listener name (letters, digits, `_` and `-`)"));
    }
    Ok(name.to_ascii_uppercase())
}

pub(crate) fn split_host_port(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.trim().rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then_some(())?;
    Some((host, port.parse().ok()?))
}

/// `HOST:PORT` to a bindable address; an empty host (Kafka's `PLAINTEXT://:9092`)
/// binds every interface.
pub(crate) fn resolve(address: &str) -> Option<SocketAddr> {
    let address = address.trim();
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = if host.is_empty() { "0.0.0.0" } else { host };
    (host, port.parse::<u16>().ok()?).to_socket_addrs().ok()?.next()
}

/// Connections open now, in total and per client address, shared by every listener:
/// `max.connections` and `max.connections.per.ip` are checked against it at accept.
#[derive(Default)]
pub(crate) struct ConnectionLimits {
    state: Arc<Mutex<LimitState>>,
}

#[derive(Default)]
struct LimitState {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
    /// When a refusal was last logged, and how many went unlogged since.
    last_logged: Option<Instant>,
    unlogged: u64,
}

/// One open connection's place in [`ConnectionLimits`], given back on drop.
pub(crate) struct ConnectionSlot {
    state: Arc<Mutex<LimitState>>,
    ip: IpAddr,
}

/// A refusal is logged at most this often (a flood must not flood the log too).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

impl ConnectionLimits {
    /// A slot for one more connection from `ip`, or which limit it would pass. A
    /// `protected` connection (the inter-broker listener's, as Kafka protects it) is
    /// counted but never refused for `max_total`: a flood of clients must not cut
    /// replication and the controller off.
    pub(crate) fn try_open(
        &self,
        ip: IpAddr,
        max_total: usize,
        max_per_ip: usize,
        protected: bool,
    ) -> Result<ConnectionSlot, ConnectionEvent> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.total >= max_total && !protected {
            return Err(ConnectionEvent::MaxConnections);
        }
        let from_ip = state.per_ip.get(&ip).copied().unwrap_or(0);
        if from_ip >= max_per_ip {
            return Err(ConnectionEvent::MaxConnectionsPerIp);
        }
        state.total += 1;
        state.per_ip.insert(ip, from_ip + 1);
        Ok(ConnectionSlot { state: self.state.clone(), ip })
    }

    /// Whether a refusal should be logged now: the first one, then one a minute with
    /// the count of those in between (returned).
    fn log_refusal(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match state.last_logged {
            Some(at) if now.duration_since(at) < REFUSAL_LOG_INTERVAL => {
                state.unlogged += 1;
                None
            }
            _ => {
                state.last_logged = Some(now);
                Some(std::mem::take(&mut state.unlogged))
            }
        }
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.total = state.total.saturating_sub(1);
        if let Some(n) = state.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                state.per_ip.remove(&self.ip);
            }
        }
    }
}

/// Accepts connections on one listener until `stop`, each served by its own task on
/// `tracker`. A connection beyond `max.connections` or `max.connections.per.ip` is
/// closed at once (as Kafka closes those over its per-IP quota): waiting in the accept
/// queue would let one client starve the others of it.
pub(crate) async fn accept(
    broker: Arc<Broker>,
    listener: TcpListener,
    info: Arc<ListenerInfo>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                let config = &broker.config;
                // Kafka's protected listener: the inter-broker one, when there are others.
                let protected = info.name == config.inter_broker_listener() && broker.listeners.len() > 1;
                match broker.connections.try_open(peer.ip(), config.max_connections, config.max_connections_per_ip, protected) {
                    Ok(slot) => {
                        let (broker, info, stop) = (broker.clone(), info.clone(), stop.clone());
                        tracker.spawn(async move {
                            connection::serve(broker, stream, peer, info, stop).await;
                            drop(slot);
                        });
                    }
                    Err(limit) => {
                        drop(stream);
                        broker.metrics.connection_event(limit);
                        if let Some(unlogged) = broker.connections.log_refusal() {
                            let key = match limit {
                                ConnectionEvent::MaxConnectionsPerIp => "max.connections.per.ip",
                                _ => "max.connections",
                            };
                            tracing::warn!(
                                %peer,
                                listener = %info.name,
                                limit = key,
                                refused_since_last_log = unlogged,
                                "connection refused: limit reached (logged at most once a minute)"
                            );
                        }
                    }
                }
            }
            Err(e) => {
                // Usually out of file descriptors: back off instead of spinning (mini-redis).
                tracing::warn!(listener = %info.name, error = %e, "accept failed; backing off");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_and_bare_listeners() {
        let listeners: Listeners = "internal://127.0.0.1:9093, EXTERNAL://127.0.0.1:9094".parse().unwrap();
        let names: Vec<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["INTERNAL", "EXTERNAL"]);
        assert_eq!(listeners.get("external").unwrap().address, "127.0.0.1:9094".parse().unwrap());
        let bare: Listeners = "127.0.0.1:9092".parse().unwrap();
        assert_eq!(bare, Listeners::from("127.0.0.1:9092".parse::<SocketAddr>().unwrap()));
        assert_eq!(bare.first().name, "PLAINTEXT");
        let wildcard: Listeners = "PLAINTEXT://:9092".parse().unwrap();
        assert!(wildcard.first().address.ip().is_unspecified());
        for bad in ["", "nope", "A://127.0.0.1:1,A://127.0.0.1:2", "A://127.0.0.1:1,B://127.0.0.1:1", "A B://h:1"] {
            assert!(matches!(bad.parse::<Listeners>(), Err(Error::InvalidConfig { .. })), "{bad:?}");
        }
    }

    #[test]
    fn protocol_map_and_advertised() {
        let map = parse_protocol_map("INTERNAL:SSL,external:sasl_ssl").unwrap();
        assert_eq!(map["INTERNAL"], SecurityProtocol::Ssl);
        assert_eq!(map["EXTERNAL"], SecurityProtocol::SaslSsl);
        assert!(parse_protocol_map("INTERNAL:TLS").is_err());
        assert!(parse_protocol_map("INTERNAL").is_err());
        assert!(parse_protocol_map("").is_err());
        let listeners: Listeners = "INTERNAL://127.0.0.1:9093,EXTERNAL://127.0.0.1:9094".parse().unwrap();
        let advertised = parse_advertised("EXTERNAL://kafka.example:19094", &listeners).unwrap();
        assert_eq!(advertised["EXTERNAL"], ("kafka.example".to_owned(), 19094));
        assert!(!advertised.contains_key("INTERNAL"));
        assert_eq!(parse_advertised("h:1", &listeners).unwrap()["INTERNAL"], ("h".to_owned(), 1));
        assert!(parse_advertised("OTHER://h:1", &listeners).is_err());
        assert!(parse_advertised("INTERNAL://h:1,INTERNAL://h:2", &listeners).is_err());
    }

    #[test]
    fn connection_limits_count_per_address_and_give_back_on_drop() {
        let limits = ConnectionLimits::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = limits.try_open(a, 3, 2, false).unwrap();
        let second = limits.try_open(a, 3, 2, false).unwrap();
        assert_eq!(limits.try_open(a, 3, 2, false).err(), Some(ConnectionEvent::MaxConnectionsPerIp));
        let third = limits.try_open(b, 3, 2, false).unwrap();
        assert_eq!(limits.try_open(b, 3, 2, false).err(), Some(ConnectionEvent::MaxConnections));
        // A protected connection passes max.connections (counted), not the per-address limit.
        let protected = limits.try_open(b, 3, 2, true).unwrap();
        assert_eq!(limits.try_open(b, 3, 2, true).err(), Some(ConnectionEvent::MaxConnectionsPerIp));
        drop(protected);
        drop(first);
        assert_eq!(limits.open(), 2);
        let again = limits.try_open(a, 3, 2, false).unwrap();
        drop((second, third, again));
        assert_eq!(limits.open(), 0);
        assert!(limits.state.lock().unwrap().per_ip.is_empty(), "no entry left per address");
        assert_eq!(limits.log_refusal(), Some(0));
        assert_eq!(limits.log_refusal(), None);
        assert_eq!(limits.log_refusal(), None);
    }
}
