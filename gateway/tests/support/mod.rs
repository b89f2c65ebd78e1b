//! A real system on loopback for the gateway's integration tests: the broker
//! ([`StandaloneBroker`]), the schema registry through `fjord_schema_registry::run` on an
//! embedded metadata store, and the gateway through `fjord_gateway::run`, each on
//! 127.0.0.1:0; plus kcat to read back what was produced, independently of our client.
#![allow(dead_code, unreachable_pub)] // each test binary uses a different part

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

use fjord_gateway::GatewayConfig;
use fjord_testkit::StandaloneBroker;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Broker + registry + gateway; everything stops when this is dropped.
pub struct System {
    pub broker: String,
    pub registry: String,
    pub http: String,
    pub grpc: String,
    shutdown: CancellationToken,
    _broker: StandaloneBroker,
    _dir: TempDir,
}

impl Drop for System {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn bind() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let a = l.local_addr().expect("local addr");
    (l, a)
}

impl System {
    pub async fn start() -> Self {
        Self::start_with(|_| {}, |_| {}).await
    }

    /// Starts the system with the broker and gateway configs adjusted by the callers.
    pub async fn start_with(
        broker: impl FnOnce(&mut fjord_broker::BrokerConfig),
        gateway: impl FnOnce(&mut GatewayConfig),
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let shutdown = CancellationToken::new();

        let broker = StandaloneBroker::builder()
            .configure(|config| {
                config.num_partitions = 3;
                broker(config);
            })
            .start()
            .await
            .expect("broker");
        let addr = broker.addr.clone();

        let store = fjord_coord::open(None, &dir.path().join("registry")).await.expect("embedded store");
        let (listener, registry_addr) = bind().await;
        tokio::spawn(fjord_schema_registry::run(
            fjord_schema_registry::RegistryConfig::default(),
            store,
            listener,
            shutdown.clone(),
        ));

        let (http, http_addr) = bind().await;
        let (grpc, grpc_addr) = bind().await;
        let mut config = GatewayConfig {
            registry_url: Some(format!("http://{registry_addr}")),
            host_name: Some("gw-it".into()),
            ..GatewayConfig::new(addr.clone())
        };
        gateway(&mut config);
        tokio::spawn(fjord_gateway::run(config, http, grpc, shutdown.clone()));
        Self {
            broker: addr,
            registry: format!("http://{registry_addr}"),
            http: format!("http://{http_addr}"),
            grpc: format!("http://{grpc_addr}"),
            shutdown,
            _broker: broker,
            _dir: dir,
        }
    }

    /// Creates a topic with `partitions` partitions through the admin client.
    pub async fn create_topic(&self, name: &str, partitions: i32) {
        let admin = fjord_client::Admin::connect(fjord_client::ClientConfig::new(&self.broker)).await.expect("admin connect");
        admin.create_topics(&[fjord_client::NewTopic::new(name, partitions)]).await.expect("create topic");
    }

    /// Log end offsets of every partition of `topic`, from the broker (not the gateway).
    pub async fn end_offsets(&self, topic: &str, partitions: i32) -> Vec<i64> {
        let admin = fjord_client::Admin::connect(fjord_client::ClientConfig::new(&self.broker)).await.expect("admin connect");
        let specs: Vec<_> = (0..partitions).map(|p| (topic.to_string(), p, fjord_client::OffsetSpec::Latest)).collect();
        admin.list_offsets(&specs).await.expect("list offsets")
    }
}

/// One message as kcat -J prints it.
#[derive(Debug, serde::Deserialize)]
pub struct KcatMessage {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub payload: Option<String>,
    #[serde(default)]
    pub headers: Vec<String>,
}

impl KcatMessage {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.chunks(2).find(|kv| kv[0] == name).map(|kv| kv[1].as_str())
    }
}

/// Every message of `topic` (all partitions), read by kcat, an independent Kafka client.
pub fn kcat_consume(broker: &str, topic: &str) -> Vec<KcatMessage> {
    let out = Command::new("kcat")
        .args(["-b", broker, "-C", "-t", topic, "-o", "beginning", "-e", "-J", "-q", "-m", "60"])
        .output()
        .expect("kcat must be installed (cargo xtask test installs it)");
    assert!(out.status.success(), "kcat failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .expect("kcat -J prints UTF-8")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("kcat line {l:?}: {e}")))
        .collect()
}

/// Consumes raw payload bytes of one partition with kcat, each printed as `SIZE:BYTES`,
/// for binary and Avro payloads.
pub fn kcat_payloads(broker: &str, topic: &str, partition: i32) -> Vec<Vec<u8>> {
    let out = Command::new("kcat")
        .args(["-b", broker, "-C", "-t", topic, "-p", &partition.to_string(), "-o", "beginning", "-e", "-q", "-f", "%S:%s"])
        .output()
        .expect("kcat must be installed");
    assert!(out.status.success(), "kcat failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut payloads = Vec::new();
    let mut rest = &out.stdout[..];
    while !rest.is_empty() {
        let colon = rest.iter().position(|b| *b == b':').expect("size prefix");
        let len: usize = std::str::from_utf8(&rest[..colon]).unwrap().parse().unwrap();
        payloads.push(rest[colon + 1..colon + 1 + len].to_vec());
        rest = &rest[colon + 1 + len..];
    }
    payloads
}

/// The Python interpreter with grpcio ([`fjord_testkit::python`]). Missing is a failure,
/// never a skip.
pub fn python() -> PathBuf {
    fjord_testkit::python().unwrap()
}

/// A gateway alone, on an existing broker: for restarts and several gateways on one
/// cluster. Stopped by [`LoneGateway::stop`] or when dropped.
pub struct LoneGateway {
    pub http: String,
    pub grpc: String,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<fjord_gateway::Result<()>>>,
}

impl LoneGateway {
    pub async fn start(broker: &str, host_name: &str) -> Self {
        let (http, http_addr) = bind().await;
        let (grpc, grpc_addr) = bind().await;
        let config = GatewayConfig { host_name: Some(host_name.into()), ..GatewayConfig::new(broker) };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(fjord_gateway::run(config, http, grpc, shutdown.clone()));
        Self { http: format!("http://{http_addr}"), grpc: format!("http://{grpc_addr}"), shutdown, task: Some(task) }
    }

    /// Stops the gateway and waits until it has: its memory (and key store) is gone.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.expect("gateway task").expect("gateway stops cleanly");
        }
    }
}

impl Drop for LoneGateway {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
