//! The client's view of the cluster: bootstrap, the metadata cache and one connection
//! per broker, shared by the producer, the consumer and the admin client.
//!
//! Metadata is refreshed when it is older than `metadata.max.age.ms`, when a caller asks
//! for a topic it does not know, and whenever a request fails in a way that says the view
//! is stale (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, a broken connection).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::security::{Prepared, SecurityConfig};

/// Settings every client shares (Kafka's names in the comments).
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `bootstrap.servers`: `host:port` of brokers to learn the cluster from.
    pub bootstrap_servers: Vec<String>,
    /// `client.id`, sent with every request.
    pub client_id: String,
    /// `socket.connection.setup.timeout.ms`: bound on one TCP connect + handshake.
    pub connect_timeout: Duration,
    /// `request.timeout.ms`: bound on waiting for one response.
    pub request_timeout: Duration,
    /// `metadata.max.age.ms`: metadata older than this is refreshed before use.
    pub metadata_max_age: Duration,
    /// `retry.backoff.ms`: pause before retrying a failed request.
    pub retry_backoff: Duration,
    /// `allow.auto.create.topics`: let metadata requests create missing topics.
    pub allow_auto_create_topics: bool,
    /// `security.protocol`, `sasl.*`, `ssl.*` (the password is never printed by `Debug`).
    pub security: SecurityConfig,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            bootstrap_servers: vec!["127.0.0.1:9092".into()],
            client_id: "fjord".into(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            metadata_max_age: Duration::from_secs(300),
            retry_backoff: Duration::from_millis(100),
            allow_auto_create_topics: true,
            security: SecurityConfig::default(),
        }
    }
}

impl ClientConfig {
    /// A config for the given comma-separated bootstrap list, defaults elsewhere.
    pub fn new(bootstrap: &str) -> Self {
        Self {
            bootstrap_servers: bootstrap.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect(),
            ..Self::default()
        }
    }

    /// Sets one setting by its Kafka name (`bootstrap.servers`, `client.id`, the
    /// `*.timeout.ms` and `retry.backoff.ms` bounds, and the security keys); an unknown
    /// key is an error, so a misspelt `sasl.pasword` is not silently ignored.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let millis = || {
            value
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| Error::InvalidConfig(format!("{key} {value:?} is not a number of milliseconds")))
        };
        match key {
            "bootstrap.servers" => self.bootstrap_servers = Self::new(value).bootstrap_servers,
            "client.id" => self.client_id = value.to_owned(),
            "socket.connection.setup.timeout.ms" => self.connect_timeout = millis()?,
            "request.timeout.ms" => self.request_timeout = millis()?,
            "metadata.max.age.ms" => self.metadata_max_age = millis()?,
            "retry.backoff.ms" => self.retry_backoff = millis()?,
            _ => {
                if !self.security.set(key, value)? {
                    return Err(Error::InvalidConfig(format!("unknown client setting {key:?}")));
                }
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<()> {
        if self.bootstrap_servers.is_empty() {
            return Err(Error::InvalidConfig("bootstrap.servers is empty".into()));
        }
        if let Some(bad) =
            self.bootstrap_servers.iter().find(|s| s.rsplit_once(':').is_none_or(|(_, p)| p.parse::<u16>().is_err()))
        {
            return Err(Error::InvalidConfig(format!("bootstrap server {bad:?} is not HOST:PORT")));
        }
        Ok(())
    }
}

/// One partition as metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMetadata {
    /// Partition number.
    pub partition: i32,
    /// Broker id of the leader, -1 when there is none.
    pub leader: i32,
    /// The leader's epoch.
    pub leader_epoch: i32,
    /// Replica broker ids.
    pub replicas: Vec<i32>,
    /// In-sync replica broker ids.
    pub in_sync_replicas: Vec<i32>,
    /// Replicas that cannot serve: their broker is down, or their log there is damaged
    /// or could not be opened.
    pub offline_replicas: Vec<i32>,
    /// The partition's error code (0: none; 56 KAFKA_STORAGE_ERROR: the leader's log is
    /// damaged or could not be opened; 5 LEADER_NOT_AVAILABLE).
    pub error_code: i16,
}

/// One topic as metadata describes it; partitions are sorted by number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    /// Topic name.
    pub name: String,
    /// Whether the topic is internal (e.g. `__consumer_offsets`).
    pub is_internal: bool,
    /// Partitions, index = partition number.
    pub partitions: Vec<PartitionMetadata>,
}

/// A snapshot of the cluster's metadata.
#[derive(Debug, Clone)]
pub struct Metadata {
    /// Broker id → `host:port`.
    pub brokers: HashMap<i32, String>,
    /// Broker id of the controller, -1 when unknown.
    pub controller: i32,
    /// Known topics.
    pub topics: HashMap<String, Arc<TopicMetadata>>,
    fetched_at: Instant,
}

/// Most coordinators a client remembers (see `Cluster::remember_coordinator`).
const MAX_KNOWN_COORDINATORS: usize = 1024;

/// Shared cluster state: metadata cache and connections.
pub(crate) struct Cluster {
    config: ClientConfig,
    /// TLS files loaded and SASL settings checked once, for every connection.
    security: Arc<Prepared>,
    metadata: RwLock<Arc<Metadata>>,
    /// Bumped by every refresh, so hot paths can cache what they derived from metadata.
    version: AtomicU64,
    connections: tokio::sync::Mutex<HashMap<String, Arc<Connection>>>,
    /// One refresh at a time; callers that waited on it reuse its result.
    refreshing: tokio::sync::Mutex<()>,
    /// Coordinators found with FindCoordinator, by key type and key, kept until a request
    /// to one fails (`transaction::with_coordinator`): a transactional producer asks its
    /// coordinator two or three times per transaction.
    coordinators: std::sync::Mutex<HashMap<(i8, String), i32>>,
}

/// Opens connections as a client would, one at a time per call, and closes them again:
/// TCP, the TLS handshake and SASL exchange `security` asks for, then ApiVersions (what
/// every client sends first). `fjord bench connect` measures new connections with it.
#[derive(Clone)]
pub struct ConnectionProbe {
    config: ClientConfig,
    security: Arc<Prepared>,
}

impl ConnectionProbe {
    /// Loads the TLS files and credentials of `config` once, for every probe.
    pub fn new(config: ClientConfig) -> Result<Self> {
        config.validate()?;
        let security = config.security.prepare()?;
        Ok(Self { config, security })
    }

    /// One connection to `broker` (`host:port`), established and then closed.
    pub async fn connect_once(&self, broker: &str) -> Result<()> {
        let c = &self.config;
        Connection::connect(broker, &c.client_id, c.connect_timeout, c.request_timeout, &self.security).await.map(drop)
    }
}

impl Cluster {
    /// Connects to the first reachable bootstrap broker and loads the broker list.
    pub(crate) async fn connect(config: ClientConfig) -> Result<Arc<Self>> {
        config.validate()?;
        let security = config.security.prepare()?;
        let cluster = Arc::new(Self {
            security,
            metadata: RwLock::new(Arc::new(Metadata {
                brokers: HashMap::new(),
                controller: -1,
                topics: HashMap::new(),
                fetched_at: Instant::now(),
            })),
            version: AtomicU64::new(0),
            connections: tokio::sync::Mutex::new(HashMap::new()),
            refreshing: tokio::sync::Mutex::new(()),
            coordinators: std::sync::Mutex::new(HashMap::new()),
            config,
        });
        cluster.refresh(None).await.map_err(|e| match e {
            Error::Io { .. } | Error::ConnectTimeout { .. } | Error::RequestTimeout { .. } => Error::BootstrapUnreachable {
                brokers: cluster.config.bootstrap_servers.join(","),
                timeout: cluster.config.connect_timeout,
                last_error: e.to_string(),
            },
            other => other,
        })?;
        Ok(cluster)
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The current metadata snapshot (possibly stale; see [`Cluster::topic`]).
    pub(crate) fn metadata(&self) -> Arc<Metadata> {
        self.metadata.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes whenever the metadata snapshot does.
    pub(crate) fn metadata_version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether the cached metadata is older than `metadata.max.age.ms`.
    pub(crate) fn metadata_is_stale(&self) -> bool {
        self.metadata().fetched_at.elapsed() >= self.config.metadata_max_age
    }

    /// The metadata snapshot, refreshed first when older than `metadata.max.age.ms`.
    /// A failed refresh leaves the old snapshot in use: requests on it fail and retry.
    pub(crate) async fn fresh_metadata(&self) -> Arc<Metadata> {
        let md = self.metadata();
        if md.fetched_at.elapsed() < self.config.metadata_max_age {
            return md;
        }
        self.refresh(None).await.unwrap_or(md)
    }

    /// Metadata of `topic`, fetching it when unknown or older than `metadata.max.age.ms`.
    pub(crate) async fn topic(&self, topic: &str) -> Result<Arc<TopicMetadata>> {
        let md = self.metadata();
        if md.fetched_at.elapsed() < self.config.metadata_max_age {
            if let Some(t) = md.topics.get(topic) {
                return Ok(t.clone());
            }
        }
        self.refresh(Some(&[topic.to_string()])).await?;
        self.metadata().topics.get(topic).cloned().ok_or_else(|| Error::UnknownTopic(topic.to_string()))
    }

    /// Fetches metadata for `topics` (all topics with `None`) and merges it into the cache.
    pub(crate) async fn refresh(&self, topics: Option<&[String]>) -> Result<Arc<Metadata>> {
        let started = Instant::now();
        let _one_at_a_time = self.refreshing.lock().await;
        // Someone refreshed while we waited: good enough for a targeted refresh.
        let current = self.metadata();
        if topics.is_some_and(|t| !t.is_empty() && t.iter().all(|t| current.topics.contains_key(t)))
            && current.fetched_at > started
        {
            return Ok(current);
        }
        let request = MetadataRequest::default()
            .with_topics(topics.map(|names| {
                names
                    .iter()
                    .map(|n| MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(n.clone())))))
                    .collect()
            }))
            .with_allow_auto_topic_creation(self.config.allow_auto_create_topics);
        let mut last_error = None;
        for addr in self.candidate_addrs(&current) {
            let conn = match self.connection_to(&addr).await {
                Ok(c) => c,
                Err(e) => {
                    last_error = Some(e);
                    continue;
                }
            };
            match conn.request(&request, 12).await {
                Ok(response) => {
                    let merged = merge(&current, response, topics.is_none())?;
                    *self.metadata.write().unwrap_or_else(|e| e.into_inner()) = merged.clone();
                    self.version.fetch_add(1, Ordering::Release);
                    return Ok(merged);
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| Error::InvalidConfig("no broker to ask for metadata".into())))
    }

    /// Known brokers first, then the bootstrap list (in case every known one is gone).
    fn candidate_addrs(&self, md: &Metadata) -> Vec<String> {
        let mut addrs: Vec<String> = md.brokers.values().cloned().collect();
        addrs.sort();
        for b in &self.config.bootstrap_servers {
            if !addrs.contains(b) {
                addrs.push(b.clone());
            }
        }
        addrs
    }

    /// The connection to broker `id`, opened if needed.
    pub(crate) async fn broker(&self, id: i32) -> Result<Arc<Connection>> {
        let addr = self.metadata().brokers.get(&id).cloned();
        match addr {
            Some(addr) => self.connection_to(&addr).await,
            None => {
                let md = self.refresh(None).await?;
                let addr = md.brokers.get(&id).cloned().ok_or_else(|| Error::LeaderNotAvailable(format!("broker {id}")))?;
                self.connection_to(&addr).await
            }
        }
    }

    /// The broker last found coordinating `key` (of FindCoordinator's `key_type`).
    pub(crate) fn known_coordinator(&self, key_type: i8, key: &str) -> Option<i32> {
        self.coordinators.lock().unwrap_or_else(|e| e.into_inner()).get(&(key_type, key.to_owned())).copied()
    }

    pub(crate) fn remember_coordinator(&self, key_type: i8, key: &str, broker: i32) {
        let mut known = self.coordinators.lock().unwrap_or_else(|e| e.into_inner());
        // A client uses a few keys (its transactional id, its groups); a tool that walks
        // many starts over rather than grow without bound.
        if known.len() >= MAX_KNOWN_COORDINATORS {
            known.clear();
        }
        known.insert((key_type, key.to_owned()), broker);
    }

    pub(crate) fn forget_coordinator(&self, key_type: i8, key: &str) {
        self.coordinators.lock().unwrap_or_else(|e| e.into_inner()).remove(&(key_type, key.to_owned()));
    }

    /// A connection to any live broker (for admin requests that any broker answers).
    pub(crate) async fn any_broker(&self) -> Result<Arc<Connection>> {
        let md = self.metadata();
        let mut last_error = None;
        for addr in self.candidate_addrs(&md) {
            match self.connection_to(&addr).await {
                Ok(c) => return Ok(c),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| Error::InvalidConfig("no broker known".into())))
    }

    /// The connection to the controller (CreateTopics/DeleteTopics must go there).
    pub(crate) async fn controller(&self) -> Result<Arc<Connection>> {
        let md = self.refresh(None).await?;
        if md.controller >= 0 && md.brokers.contains_key(&md.controller) {
            self.broker(md.controller).await
        } else {
            self.any_broker().await
        }
    }

    /// Leader broker id of a partition, or an error saying why there is none.
    pub(crate) async fn leader(&self, topic: &str, partition: i32) -> Result<i32> {
        let t = self.topic(topic).await?;
        let p = t
            .partitions
            .get(partition as usize)
            .ok_or_else(|| Error::UnknownPartition { topic: topic.to_string(), partition })?;
        if p.leader < 0 {
            return Err(Error::LeaderNotAvailable(format!("{topic}-{partition}")));
        }
        Ok(p.leader)
    }

    async fn connection_to(&self, addr: &str) -> Result<Arc<Connection>> {
        let mut pool = self.connections.lock().await;
        if let Some(c) = pool.get(addr) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let conn = Arc::new(
            Connection::connect(
                addr,
                &self.config.client_id,
                self.config.connect_timeout,
                self.config.request_timeout,
                &self.security,
            )
            .await?,
        );
        pool.insert(addr.to_string(), conn.clone());
        Ok(conn)
    }
}

fn merge(current: &Metadata, response: kafka_protocol::messages::MetadataResponse, all_topics: bool) -> Result<Arc<Metadata>> {
    let brokers = response.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port))).collect();
    let mut topics = if all_topics { HashMap::new() } else { current.topics.clone() };
    for t in response.topics {
        let Some(name) = t.name.map(|n| n.0.to_string()) else { continue };
        match t.error_code {
            0 => {}
            // A topic that is gone (or not there yet) leaves the cache.
            3 | 5 => {
                topics.remove(&name);
                continue;
            }
            code => {
                if let Some(e) = Error::kafka(code, format!("metadata for topic {name}"), None) {
                    return Err(e);
                }
            }
        }
        let mut partitions: Vec<PartitionMetadata> = t
            .partitions
            .iter()
            .map(|p| PartitionMetadata {
                partition: p.partition_index,
                leader: p.leader_id.0,
                leader_epoch: p.leader_epoch,
                replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
                in_sync_replicas: p.isr_nodes.iter().map(|b| b.0).collect(),
                offline_replicas: p.offline_replicas.iter().map(|b| b.0).collect(),
                error_code: p.error_code,
            })
            .collect();
        partitions.sort_by_key(|p| p.partition);
        topics.insert(name.clone(), Arc::new(TopicMetadata { name, is_internal: t.is_internal, partitions }));
    }
    Ok(Arc::new(Metadata { brokers, controller: response.controller_id.0, topics, fetched_at: Instant::now() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_lists_are_parsed_and_checked() {
        let c = ClientConfig::new("a:1, b:2,");
        assert_eq!(c.bootstrap_servers, ["a:1", "b:2"]);
        assert!(c.validate().is_ok());
        assert!(matches!(ClientConfig::new("").validate(), Err(Error::InvalidConfig(_))));
        assert!(matches!(ClientConfig::new("host-without-port").validate(), Err(Error::InvalidConfig(_))));
        assert!(matches!(ClientConfig::new("h:99999").validate(), Err(Error::InvalidConfig(_))));
    }

    #[tokio::test]
    async fn unreachable_bootstrap_fails_fast_with_a_clear_error() {
        // A port nobody listens on: bind, learn the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut config = ClientConfig::new(&format!("127.0.0.1:{port}"));
        config.connect_timeout = Duration::from_secs(2);
        let started = Instant::now();
        let err = Cluster::connect(config).await.err().expect("must fail");
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(matches!(err, Error::BootstrapUnreachable { .. }), "{err}");
        assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
    }
}
