//! A real ZooKeeper and N brokers on loopback: the fixture of the cluster tests.
//!
//! Brokers run either as child processes of the `fjord` binary (the only way to test
//! `kill -9`, SIGSTOP and a restart on the same data dir as a real crash) or as tasks in
//! this process (faster to start, clean stops only). Every broker keeps its port and data
//! dir across restarts, so clients that knew it find it again. Everything the tests ask
//! about the cluster (leaders, ISRs, the controller) is read from ZooKeeper, the source of
//! truth, through a session of the cluster's own.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use fjord_auth::{ScramCredential, ScramMechanism};
use fjord_broker::BrokerConfig;
use fjord_client::{Admin, ClientConfig, NewTopic, SecurityConfig};
use fjord_coord::registry::{read_json, PartitionState, TopicAssignment};
use fjord_coord::{paths, Store, ZooKeeperStore};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{reserve_port, wait_until, Certs, ZooKeeper};

/// How long a broker may take to start serving (a restart after `kill -9` waits for the
/// old ZooKeeper session to expire before it can register again).
const START_TIMEOUT: Duration = Duration::from_secs(45);
/// How long a clean stop may take (controlled shutdown moves leaderships away first).
const STOP_TIMEOUT: Duration = Duration::from_secs(45);
/// Session timeout of the brokers unless the test sets `zookeeper.session.timeout.ms`:
/// short, so a killed broker is noticed in seconds, not in Kafka's 18 s.
const SESSION_TIMEOUT_MS: &str = "3000";
/// The SCRAM iteration count of the users the fixture writes (Kafka's minimum).
const SCRAM_ITERATIONS: u32 = 4096;
/// The super user and the brokers' own identity of [`ClusterBuilder::sasl_ssl`].
pub const SECURE_ADMIN: &str = "admin";
const SECURE_BROKER: &str = "broker";

/// How the brokers run.
#[derive(Debug, Clone)]
enum Mode {
    InProcess,
    /// Child processes of this `fjord` binary.
    Process(PathBuf),
}

/// Configures and starts a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    brokers: usize,
    mode: Mode,
    configs: Vec<(String, String)>,
    zookeeper: Option<String>,
    /// Listener names, one loopback port each; empty: the one bare (PLAINTEXT) address.
    listeners: Vec<String>,
    /// SCRAM users written into the cluster's chroot before any broker starts.
    users: Vec<(String, String)>,
    /// How the fixture's own clients reach the first listener.
    client_security: SecurityConfig,
    /// [`ClusterBuilder::sasl_ssl`] was asked for: certificates and keys made at start.
    sasl_ssl: bool,
    /// Log dirs per broker (`log.dirs`, JBOD); default 1.
    log_dirs: usize,
}

impl ClusterBuilder {
    /// Number of brokers (ids 0..n); default 3.
    pub fn brokers(mut self, n: usize) -> Self {
        self.brokers = n;
        self
    }

    /// Runs the brokers as child processes of `fjord_binary` (a test of the `fjord` package
    /// passes `env!("CARGO_BIN_EXE_fjord")`), so they can be killed with SIGKILL and paused.
    pub fn processes(mut self, fjord_binary: impl Into<PathBuf>) -> Self {
        self.mode = Mode::Process(fjord_binary.into());
        self
    }

    /// Gives every broker `n` log dirs (`log.dirs`, JBOD) instead of one: its data dir
    /// first, then `broker-<id>-dir<i>` beside it (see [`Cluster::log_dirs`]).
    pub fn log_dirs_per_broker(mut self, n: usize) -> Self {
        self.log_dirs = n.max(1);
        self
    }

    /// Sets a broker config key (Kafka's name, as in the TOML file) on every broker.
    pub fn config(mut self, key: &str, value: impl ToString) -> Self {
        self.configs.push((key.to_owned(), value.to_string()));
        self
    }

    /// Uses an already running ZooKeeper (`host:port`, no chroot) instead of starting one;
    /// the cluster still gets a chroot of its own.
    pub fn zookeeper(mut self, connect: impl Into<String>) -> Self {
        self.zookeeper = Some(connect.into());
        self
    }

    /// Named listeners instead of the one PLAINTEXT address: every broker binds one
    /// loopback port per name, in this order (`NAME://127.0.0.1:PORT,...`). The first is
    /// the one [`Cluster::addr`], [`Cluster::bootstrap`] and the fixture's own clients
    /// use; [`Cluster::listener_addr`] gives the others. What each name speaks and which
    /// one brokers use among themselves are ordinary configs
    /// (`listener.security.protocol.map`, `inter.broker.listener.name`, ...).
    pub fn listeners(mut self, names: &[&str]) -> Self {
        self.listeners = names.iter().map(|n| n.to_ascii_uppercase()).collect();
        self
    }

    /// A SCRAM user (SHA-256 and SHA-512 credentials, never the password) written into the
    /// cluster's metadata before any broker starts: a broker's inter-broker identity, a
    /// test's client.
    pub fn scram_user(mut self, name: &str, password: &str) -> Self {
        self.users.push((name.to_owned(), password.to_owned()));
        self
    }

    /// How the fixture's own clients (the start-up probe, [`Cluster::create_topic`]) and
    /// [`Cluster::client_config`] connect to the first listener; plaintext by default.
    pub fn client_security(mut self, security: SecurityConfig) -> Self {
        self.client_security = security;
        self
    }

    /// Nothing plaintext, as `deploy/secure` lays a cluster out: each broker serves a
    /// SASL_SSL listener `CLIENT` for clients and a SASL_SSL listener `INTERNAL` for
    /// replication, where it authenticates as user `broker` (SCRAM-SHA-512) with a
    /// password of its own; a test CA and server certificate (see [`Certs`]), SCRAM and
    /// PLAIN, and the authorizer on with [`SECURE_ADMIN`] and `broker` as super users and
    /// no ACLs. The fixture's clients are the admin over SCRAM-SHA-256
    /// ([`Cluster::secure`] has its password and the CA). Configs set with
    /// [`ClusterBuilder::config`] still apply on top.
    pub fn sasl_ssl(mut self) -> Self {
        self.sasl_ssl = true;
        self.listeners = vec!["CLIENT".into(), "INTERNAL".into()];
        self
    }

    /// Starts ZooKeeper (unless given) and every broker, and waits until each one serves.
    pub async fn start(mut self) -> Result<Cluster> {
        let dir = tempfile::Builder::new().prefix("fjord-cluster-").tempdir()?;
        let secure = match self.sasl_ssl {
            true => Some(self.prepare_sasl_ssl(dir.path())?),
            false => None,
        };
        // Each config is checked once here, so a typo fails the test at its start with
        // the broker's own message rather than as a broker that never comes up.
        let mut probe = BrokerConfig::default();
        for (key, value) in &self.configs {
            probe.set(key, value).with_context(|| format!("cluster config {key}={value}"))?;
        }
        let (zookeeper, hosts) = match self.zookeeper {
            Some(hosts) => (None, hosts),
            None => {
                let zk = tokio::task::spawn_blocking(ZooKeeper::start).await??;
                let hosts = zk.connect_string();
                (Some(zk), hosts)
            }
        };
        let connect = format!("{hosts}{}", unique_chroot());
        let store: Store = std::sync::Arc::new(
            ZooKeeperStore::connect(&connect, Duration::from_secs(10))
                .await
                .with_context(|| format!("test session on ZooKeeper {connect}"))?,
        );
        for (user, password) in &self.users {
            for mechanism in ScramMechanism::ALL {
                let credential = ScramCredential::generate(mechanism, password, SCRAM_ITERATIONS)?;
                fjord_auth::store::set_credential(&*store, user, mechanism, &credential)
                    .await
                    .with_context(|| format!("writing the SCRAM credential of {user}"))?;
            }
        }
        // One entry per key, the last one set winning (a TOML file may not repeat a key).
        let mut configs: Vec<(String, String)> = Vec::new();
        for (key, value) in
            [("zookeeper.session.timeout.ms".to_owned(), SESSION_TIMEOUT_MS.to_owned())].into_iter().chain(self.configs)
        {
            configs.retain(|(k, _)| *k != key);
            configs.push((key, value));
        }
        let mut cluster = Cluster {
            brokers: BTreeMap::new(),
            store,
            connect,
            mode: self.mode,
            configs,
            listeners: self.listeners,
            client_security: self.client_security,
            secure,
            dir,
            _zookeeper: zookeeper,
        };
        for id in 0..self.brokers as i32 {
            let data_dir = cluster.dir.path().join(format!("broker-{id}"));
            std::fs::create_dir_all(&data_dir)?;
            let other_log_dirs = (1..self.log_dirs).map(|i| cluster.dir.path().join(format!("broker-{id}-dir{i}"))).collect();
            let reserved = (0..cluster.listeners.len().max(1)).map(|_| reserve_port(0)).collect::<std::io::Result<Vec<_>>>()?;
            let ports = reserved.iter().map(|l| Ok(l.local_addr()?.port())).collect::<Result<_>>()?;
            let log_file = cluster.dir.path().join(format!("broker-{id}.log"));
            let node = Node { ports, reserved, log_file, data_dir, other_log_dirs, running: None };
            cluster.brokers.insert(id, node);
        }
        // Start them all, then wait for them all: their start-ups overlap.
        for id in cluster.ids() {
            cluster.launch(id).await?;
        }
        for id in cluster.ids() {
            cluster.wait_serving(id).await?;
        }
        Ok(cluster)
    }

    /// The certificates, passwords, users and configs of [`ClusterBuilder::sasl_ssl`],
    /// made under `dir`; the configs go first, so the test's own override them.
    fn prepare_sasl_ssl(&mut self, dir: &Path) -> Result<SecureCluster> {
        let certs_dir = dir.join("certs");
        std::fs::create_dir_all(&certs_dir)?;
        let certs = Certs::create(&certs_dir)?;
        let secure = SecureCluster {
            ca: certs.dir.join("ca.pem"),
            // Fixed: a test cluster on loopback, deleted with it, guards nothing.
            admin_password: "admin-secret".into(),
            broker_password: "broker-secret".into(),
        };
        let keystore = certs.path("server-keystore.pem");
        let ca = certs.path("ca.pem");
        let ours: Vec<(String, String)> = [
            ("listener.security.protocol.map", "CLIENT:SASL_SSL,INTERNAL:SASL_SSL".to_owned()),
            ("inter.broker.listener.name", "INTERNAL".into()),
            ("ssl.keystore.type", "PEM".into()),
            ("ssl.keystore.location", keystore),
            ("ssl.truststore.location", ca),
            ("sasl.enabled.mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN".into()),
            ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512".into()),
            ("inter.broker.sasl.username", SECURE_BROKER.into()),
            ("inter.broker.sasl.password", secure.broker_password.clone()),
            ("authorizer.enable", "true".into()),
            ("super.users", format!("User:{SECURE_ADMIN};User:{SECURE_BROKER}")),
            ("allow.everyone.if.no.acl.found", "false".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        self.configs = ours.into_iter().chain(std::mem::take(&mut self.configs)).collect();
        self.users.insert(0, (SECURE_ADMIN.into(), secure.admin_password.clone()));
        self.users.insert(1, (SECURE_BROKER.into(), secure.broker_password.clone()));
        let mut security = SecurityConfig::default();
        for (key, value) in secure.client_properties() {
            security.set(&key, &value).with_context(|| format!("client property {key}"))?;
        }
        self.client_security = security;
        Ok(secure)
    }
}

/// What the clients of a [`ClusterBuilder::sasl_ssl`] cluster need.
#[derive(Debug, Clone)]
pub struct SecureCluster {
    /// The CA the brokers' certificate chains to (`ssl.ca.location`).
    pub ca: PathBuf,
    /// [`SECURE_ADMIN`]'s password.
    pub admin_password: String,
    broker_password: String,
}

impl SecureCluster {
    /// Kafka client properties of the admin (`security.protocol` ... `ssl.ca.location`),
    /// without `bootstrap.servers`: what confluent-kafka and kafka-python take.
    pub fn client_properties(&self) -> Vec<(String, String)> {
        self.user_properties(SECURE_ADMIN, &self.admin_password)
    }

    /// The same for another user (see [`ClusterBuilder::scram_user`]).
    pub fn user_properties(&self, user: &str, password: &str) -> Vec<(String, String)> {
        [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-256"),
            ("sasl.username", user),
            ("sasl.password", password),
            ("ssl.ca.location", self.ca.to_str().unwrap_or_default()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }
}

/// One broker's fixed place: ports (one per listener), data dir, log file; and its run,
/// if any.
struct Node {
    ports: Vec<u16>,
    /// The ports, held bound while the broker does not run: a port picked and then let go
    /// can be handed to any other socket on the machine (an outgoing connection's local
    /// port, another test's port 0) before the broker binds it. Bound, not listening: a
    /// client connecting to a stopped broker is refused at once, as with no socket.
    reserved: Vec<TcpSocket>,
    data_dir: PathBuf,
    /// The log dirs after `data_dir` ([`ClusterBuilder::log_dirs_per_broker`]).
    other_log_dirs: Vec<PathBuf>,
    log_file: PathBuf,
    running: Option<Running>,
}

enum Running {
    Process(Child),
    InProcess { shutdown: CancellationToken, task: JoinHandle<fjord_broker::Result<()>> },
}

/// ZooKeeper and brokers 0..n on loopback. Dropping it kills every broker (and the
/// ZooKeeper it started) and deletes the data. If the test is panicking, the tail of each
/// broker's log is printed first, as the evidence of what went wrong, and with
/// `FJORD_TEST_KEEP` set the data dirs and logs are kept.
pub struct Cluster {
    brokers: BTreeMap<i32, Node>,
    store: Store,
    connect: String,
    mode: Mode,
    configs: Vec<(String, String)>,
    listeners: Vec<String>,
    client_security: SecurityConfig,
    secure: Option<SecureCluster>,
    dir: tempfile::TempDir,
    // Dropped last: the brokers go first.
    _zookeeper: Option<ZooKeeper>,
}

impl Cluster {
    /// A builder for 3 in-process brokers on a ZooKeeper of their own.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder {
            brokers: 3,
            mode: Mode::InProcess,
            configs: Vec::new(),
            zookeeper: None,
            listeners: Vec::new(),
            users: Vec::new(),
            client_security: SecurityConfig::default(),
            sasl_ssl: false,
            log_dirs: 1,
        }
    }

    /// Broker ids.
    pub fn ids(&self) -> Vec<i32> {
        self.brokers.keys().copied().collect()
    }

    /// `host:port` of every broker, comma-separated (running or not: clients skip the
    /// unreachable ones).
    pub fn bootstrap(&self) -> String {
        self.ids().iter().map(|&id| self.addr(id)).collect::<Vec<_>>().join(",")
    }

    /// `127.0.0.1:PORT` of broker `id` (its first listener's).
    pub fn addr(&self, id: i32) -> String {
        format!("127.0.0.1:{}", self.node(id).ports[0])
    }

    /// `127.0.0.1:PORT` of broker `id`'s listener `name` (see [`ClusterBuilder::listeners`]).
    pub fn listener_addr(&self, id: i32, name: &str) -> Result<String> {
        let index = self
            .listeners
            .iter()
            .position(|l| l.eq_ignore_ascii_case(name))
            .ok_or_else(|| anyhow!("no listener {name} (the listeners are {:?})", self.listeners))?;
        Ok(format!("127.0.0.1:{}", self.node(id).ports[index]))
    }

    /// A client config for every broker's first listener, with the fixture's client
    /// security (the admin's, for [`ClusterBuilder::sasl_ssl`]).
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig { security: self.client_security.clone(), ..ClientConfig::new(&self.bootstrap()) }
    }

    /// The certificates and passwords of a [`ClusterBuilder::sasl_ssl`] cluster.
    pub fn secure(&self) -> Option<&SecureCluster> {
        self.secure.as_ref()
    }

    /// The brokers' `zookeeper.connect`, chroot included.
    pub fn zookeeper_connect(&self) -> &str {
        &self.connect
    }

    /// A ZooKeeper session on the cluster's chroot, for reads (and deliberate writes) of
    /// the registry.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Broker `id`'s log dir (`log.dirs`; the first, with several).
    pub fn data_dir(&self, id: i32) -> &Path {
        &self.node(id).data_dir
    }

    /// Every log dir of broker `id`, the data dir first.
    pub fn log_dirs(&self, id: i32) -> Vec<PathBuf> {
        let node = self.node(id);
        std::iter::once(node.data_dir.clone()).chain(node.other_log_dirs.iter().cloned()).collect()
    }

    /// Whether broker `id` was started and not stopped or killed since (a paused broker
    /// is running).
    pub fn is_running(&self, id: i32) -> bool {
        self.node(id).running.is_some()
    }

    /// Starts broker `id` again, on its port and data dir, and waits until it serves.
    pub async fn start(&mut self, id: i32) -> Result<()> {
        if self.is_running(id) {
            bail!("broker {id} is already running");
        }
        self.launch(id).await?;
        self.wait_serving(id).await
    }

    /// `kill -9`: no flush, no checkpoint, no deregistration (ZooKeeper notices when the
    /// session expires). Child-process brokers only.
    pub async fn kill(&mut self, id: i32) -> Result<()> {
        let running = self.node_mut(id).running.take().ok_or_else(|| anyhow!("broker {id} is not running"))?;
        let Running::Process(mut child) = running else {
            self.node_mut(id).running = Some(running);
            bail!("kill -9 needs brokers as processes (ClusterBuilder::processes)");
        };
        child.kill().with_context(|| format!("SIGKILL broker {id}"))?;
        tokio::task::spawn_blocking(move || child.wait()).await??;
        self.reserve_ports(id);
        Ok(())
    }

    /// A clean stop (SIGTERM for a process, the shutdown token in process) that waits
    /// until the broker has exited; fails if it exited with an error.
    pub async fn stop(&mut self, id: i32) -> Result<()> {
        let running = self.node_mut(id).running.take().ok_or_else(|| anyhow!("broker {id} is not running"))?;
        match running {
            Running::Process(mut child) => {
                signal(&child, Signal::SIGCONT)?; // a paused broker could not act on SIGTERM
                signal(&child, Signal::SIGTERM)?;
                let waited = tokio::time::timeout(
                    STOP_TIMEOUT,
                    tokio::task::spawn_blocking(move || {
                        let status = child.wait();
                        (child, status)
                    }),
                )
                .await;
                match waited {
                    Ok(joined) => {
                        let (_, status) = joined?;
                        let status = status?;
                        if !status.success() {
                            bail!("broker {id} exited with {status} after SIGTERM:\n{}", self.log_tail(id, 30));
                        }
                    }
                    Err(_) => bail!("broker {id} did not exit within {STOP_TIMEOUT:?} of SIGTERM:\n{}", self.log_tail(id, 30)),
                }
            }
            Running::InProcess { shutdown, task } => {
                shutdown.cancel();
                tokio::time::timeout(STOP_TIMEOUT, task)
                    .await
                    .map_err(|_| anyhow!("broker {id} did not stop within {STOP_TIMEOUT:?}"))??
                    .with_context(|| format!("broker {id} failed"))?;
            }
        }
        self.reserve_ports(id);
        Ok(())
    }

    /// Holds a stopped broker's ports again until it starts (see [`Node::reserved`]). All
    /// or none: if another socket took one meanwhile, the start binds and reports it.
    fn reserve_ports(&mut self, id: i32) {
        let node = self.node_mut(id);
        let held: std::io::Result<Vec<_>> = node.ports.iter().map(|port| reserve_port(*port)).collect();
        node.reserved = held.unwrap_or_default();
    }

    /// SIGSTOP: the broker keeps its sockets and its session (until ZooKeeper expires it)
    /// but does nothing. Child-process brokers only.
    pub fn pause(&self, id: i32) -> Result<()> {
        signal(self.child(id)?, Signal::SIGSTOP)
    }

    /// SIGCONT after [`Cluster::pause`].
    pub fn resume(&self, id: i32) -> Result<()> {
        signal(self.child(id)?, Signal::SIGCONT)
    }

    /// OS process id of a child-process broker.
    pub fn pid(&self, id: i32) -> Result<u32> {
        Ok(self.child(id)?.id())
    }

    /// The state znode of a partition (`None` before the topic's creation wrote it).
    pub async fn partition_state(&self, topic: &str, partition: i32) -> Result<Option<PartitionState>> {
        Ok(read_json::<PartitionState>(&*self.store, &paths::partition_state(topic, partition)).await?.map(|(state, _)| state))
    }

    /// The replica assignment of a topic.
    pub async fn assignment(&self, topic: &str) -> Result<Option<TopicAssignment>> {
        Ok(read_json::<TopicAssignment>(&*self.store, &paths::topic(topic)).await?.map(|(a, _)| a))
    }

    /// The partition's leader, `None` when it has none (-1) or no state yet.
    pub async fn leader(&self, topic: &str, partition: i32) -> Result<Option<i32>> {
        Ok(self.partition_state(topic, partition).await?.map(|s| s.leader).filter(|&l| l >= 0))
    }

    /// Waits until the partition's state satisfies `accept` and returns it.
    pub async fn wait_for_state(
        &self,
        topic: &str,
        partition: i32,
        timeout: Duration,
        what: &str,
        accept: impl Fn(&PartitionState) -> bool,
    ) -> Result<PartitionState> {
        let described = format!("{topic}-{partition}: {what}");
        let accept = &accept;
        let waited =
            wait_until(timeout, &described, || async move { Ok(self.partition_state(topic, partition).await?.filter(accept)) })
                .await;
        match waited {
            Ok(state) => Ok(state),
            Err(e) => Err(e.context(self.describe_states_of(topic).await)),
        }
    }

    /// Waits until the partition has a leader, and returns its id.
    pub async fn wait_for_leader(&self, topic: &str, partition: i32, timeout: Duration) -> Result<i32> {
        Ok(self.wait_for_state(topic, partition, timeout, "a leader", |s| s.leader >= 0).await?.leader)
    }

    /// Waits until the transaction coordinator of `transactional_id` is up and returns its
    /// broker id: the leader of its `__transaction_state` partition (Kafka's: Java's
    /// String hash of the id, modulo the topic's `partitions`).
    pub async fn wait_for_txn_coordinator(&self, transactional_id: &str, partitions: i32, timeout: Duration) -> Result<i32> {
        let hash = transactional_id.encode_utf16().fold(0i32, |h, u| h.wrapping_mul(31).wrapping_add(i32::from(u)));
        let partition = (if hash == i32::MIN { 0 } else { hash.abs() }) % partitions;
        self.wait_for_leader("__transaction_state", partition, timeout).await
    }

    /// Waits until the partition has a leader and exactly `isr` (any order) in sync.
    pub async fn wait_for_isr(&self, topic: &str, partition: i32, isr: &[i32], timeout: Duration) -> Result<PartitionState> {
        let mut want = isr.to_vec();
        want.sort_unstable();
        self.wait_for_state(topic, partition, timeout, &format!("ISR {want:?}"), |s| {
            let mut have = s.isr.clone();
            have.sort_unstable();
            s.leader >= 0 && have == want
        })
        .await
    }

    /// Waits until every partition of `topic` (per its assignment) has a leader and all
    /// its assigned replicas in sync: the state after a creation, or after a recovery.
    pub async fn wait_fully_replicated(&self, topic: &str, timeout: Duration) -> Result<()> {
        let assignment =
            wait_until(timeout, &format!("the assignment of {topic}"), || async { self.assignment(topic).await }).await?;
        for (partition, replicas) in &assignment.partitions {
            let partition: i32 = partition.parse().with_context(|| format!("partition {partition:?} of {topic}"))?;
            self.wait_for_isr(topic, partition, replicas, timeout).await?;
        }
        Ok(())
    }

    /// Creates `topic` with `partitions` partitions, each replicated on every broker, and
    /// the topic configs `configs`, through the Kafka protocol (fjord-client's [`Admin`],
    /// as an operator would); then waits until every partition has a leader and all its
    /// replicas in sync.
    pub async fn create_topic(&self, topic: &str, partitions: i32, configs: &[(&str, &str)], timeout: Duration) -> Result<()> {
        let mut new = NewTopic::new(topic, partitions);
        new.replication_factor = i16::try_from(self.brokers.len()).context("replication factor")?;
        new.configs = configs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let admin = Admin::connect(self.client_config()).await.context("admin client on the cluster")?;
        admin.create_topics(&[new]).await.with_context(|| format!("create topic {topic}"))?;
        self.wait_fully_replicated(topic, timeout).await
    }

    /// The broker id in `/controller`, if a controller is elected.
    pub async fn controller(&self) -> Result<Option<i32>> {
        let Some((data, _)) = self.store.get(paths::CONTROLLER).await? else { return Ok(None) };
        let value: serde_json::Value = serde_json::from_slice(&data).context("/controller is not JSON")?;
        // docs/architecture.md names the field `broker_id`; Kafka's `brokerid` is read too.
        let id = value.get("broker_id").or_else(|| value.get("brokerid")).and_then(serde_json::Value::as_i64);
        Ok(Some(id.ok_or_else(|| anyhow!("no broker id in /controller: {value}"))? as i32))
    }

    /// Waits until a controller other than those in `not` is elected, and returns it.
    pub async fn wait_for_controller(&self, not: &[i32], timeout: Duration) -> Result<i32> {
        wait_until(timeout, &format!("a controller other than {not:?}"), || async {
            Ok(self.controller().await?.filter(|id| !not.contains(id)))
        })
        .await
    }

    /// Ids under `/brokers/ids`, sorted.
    pub async fn registered_brokers(&self) -> Result<Vec<i32>> {
        let mut ids: Vec<i32> = match self.store.children(paths::BROKER_IDS).await {
            Ok(children) => children.iter().filter_map(|c| c.parse().ok()).collect(),
            Err(fjord_coord::Error::NoNode { .. }) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        ids.sort_unstable();
        Ok(ids)
    }

    /// Waits until exactly `ids` are registered (e.g. until ZooKeeper has expired a
    /// killed broker's session).
    pub async fn wait_for_registered(&self, ids: &[i32], timeout: Duration) -> Result<()> {
        let mut want = ids.to_vec();
        want.sort_unstable();
        wait_until(timeout, &format!("registered brokers {want:?}"), || async {
            Ok((self.registered_brokers().await? == want).then_some(()))
        })
        .await
    }

    /// The bytes of a partition's log on broker `id`: its `.log` segments concatenated in
    /// offset order. Two replicas that hold the same batches at the same offsets give the
    /// same bytes (the batches are stored exactly as on the wire).
    pub fn log_bytes(&self, id: i32, topic: &str, partition: i32) -> Result<Vec<u8>> {
        let dir = self.data_dir(id).join(format!("{topic}-{partition}"));
        let mut segments: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("{}", dir.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        // 20-digit zero-padded base offsets: name order is offset order.
        segments.retain(|p| p.extension().is_some_and(|e| e == "log"));
        segments.sort();
        let mut bytes = Vec::new();
        for segment in segments {
            bytes.extend(std::fs::read(&segment).with_context(|| format!("{}", segment.display()))?);
        }
        Ok(bytes)
    }

    /// The last `lines` lines of broker `id`'s output (its tracing log), across restarts.
    pub fn log_tail(&self, id: i32, lines: usize) -> String {
        match &self.mode {
            Mode::InProcess => "(in-process broker: its log goes to the test's tracing subscriber)".into(),
            Mode::Process(_) => {
                let text = std::fs::read_to_string(&self.node(id).log_file).unwrap_or_default();
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
        }
    }

    /// Partition states of a topic, one line each: context for a failed wait.
    async fn describe_states_of(&self, topic: &str) -> String {
        let mut out = format!("partition states of {topic}:");
        let partitions = format!("{}/partitions", paths::topic(topic));
        let Ok(children) = self.store.children(&partitions).await else {
            return format!("{out} (none readable)");
        };
        for p in children {
            let state = self.store.get(&format!("{partitions}/{p}/state")).await.ok().flatten();
            let text = state.map(|(d, s)| format!("{} (version {})", String::from_utf8_lossy(&d), s.version));
            let _ = write!(out, "\n  {p}: {}", text.unwrap_or_else(|| "none".into()));
        }
        out
    }

    fn node(&self, id: i32) -> &Node {
        self.brokers.get(&id).unwrap_or_else(|| panic!("no broker {id} in this cluster"))
    }

    fn node_mut(&mut self, id: i32) -> &mut Node {
        self.brokers.get_mut(&id).unwrap_or_else(|| panic!("no broker {id} in this cluster"))
    }

    fn child(&self, id: i32) -> Result<&Child> {
        match &self.node(id).running {
            Some(Running::Process(child)) => Ok(child),
            Some(Running::InProcess { .. }) => bail!("signals need brokers as processes (ClusterBuilder::processes)"),
            None => bail!("broker {id} is not running"),
        }
    }

    /// Starts broker `id` without waiting for it to serve.
    async fn launch(&mut self, id: i32) -> Result<()> {
        // Let go of the ports only now; in process, the first is handed over bound.
        let mut reserved = std::mem::take(&mut self.node_mut(id).reserved).into_iter();
        let first_reserved = reserved.next();
        drop(reserved);
        let node = self.node(id);
        let listen = match self.listeners.is_empty() {
            true => format!("127.0.0.1:{}", node.ports[0]),
            false => {
                let named = self.listeners.iter().zip(&node.ports).map(|(name, port)| format!("{name}://127.0.0.1:{port}"));
                named.collect::<Vec<_>>().join(",")
            }
        };
        let running = match &self.mode {
            Mode::Process(binary) => {
                // Extra keys go through the same TOML file users write.
                let config_file = self.dir.path().join(format!("broker-{id}.toml"));
                let mut toml = String::new();
                for (key, value) in &self.configs {
                    let _ = writeln!(toml, "{} = {}", toml_string(key), toml_string(value));
                }
                std::fs::write(&config_file, toml)?;
                let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&node.log_file)?;
                writeln!(log, "---- fjord broker {id} starting ----")?;
                let log_dirs: Vec<String> =
                    std::iter::once(&node.data_dir).chain(&node.other_log_dirs).map(|d| d.display().to_string()).collect();
                drop(first_reserved);
                let child = Command::new(binary)
                    .args(["broker", "--config"])
                    .arg(&config_file)
                    .args(["--id", &id.to_string(), "--listen", &listen, "--zookeeper", &self.connect, "--data-dir"])
                    .arg(log_dirs.join(","))
                    .env("RUST_LOG", std::env::var("FJORD_TEST_BROKER_LOG").unwrap_or_else(|_| "info".into()))
                    // The log is a file that tests print: no terminal colour codes.
                    .env("NO_COLOR", "1")
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .spawn()
                    .with_context(|| format!("starting {}", binary.display()))?;
                Running::Process(child)
            }
            Mode::InProcess => {
                let mut config = BrokerConfig::default();
                for (key, value) in &self.configs {
                    config.set(key, value)?;
                }
                config.broker_id = id;
                config.listeners = listen.parse()?;
                config.log_dir = node.data_dir.clone();
                config.other_log_dirs = node.other_log_dirs.clone();
                config.zookeeper_connect = Some(self.connect.clone());
                fjord_audit::BrokerTier::install(&mut config)?;
                // The first listener is bound here (or still is); `run` binds the others
                // from `listeners`.
                let first = format!("127.0.0.1:{}", node.ports[0]);
                let listener = match first_reserved {
                    Some(held) => held.listen(1024)?,
                    None => TcpListener::bind(&first).await.with_context(|| format!("binding {first} for broker {id}"))?,
                };
                let shutdown = CancellationToken::new();
                let task = tokio::spawn(fjord_broker::run(config, listener, shutdown.clone()));
                Running::InProcess { shutdown, task }
            }
        };
        self.node_mut(id).running = Some(running);
        Ok(())
    }

    /// Waits until broker `id` answers an ApiVersions request: its accept loop runs only
    /// once it has registered in ZooKeeper, so it is then a full member.
    async fn wait_serving(&mut self, id: i32) -> Result<()> {
        let addr = self.addr(id);
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            if let Some(exited) = self.exited(id).await {
                bail!("broker {id} exited while starting: {exited}\n{}", self.log_tail(id, 40));
            }
            if self.answers(&addr).await {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("broker {id} did not serve on {addr} within {START_TIMEOUT:?}\n{}", self.log_tail(id, 40));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the broker at `addr` answers: ApiVersions on a plaintext first listener;
    /// otherwise a metadata request of a client with the fixture's security (TLS and SASL
    /// must work too, so the broker's credentials and certificates are known good).
    async fn answers(&self, addr: &str) -> bool {
        if self.client_security.protocol == fjord_client::SecurityProtocol::Plaintext {
            return api_versions(addr).await.is_ok();
        }
        let config = ClientConfig {
            security: self.client_security.clone(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
            ..ClientConfig::new(addr)
        };
        Admin::connect(config).await.is_ok()
    }

    /// `Some(how)` once a started broker has ended (it then counts as not running).
    async fn exited(&mut self, id: i32) -> Option<String> {
        let node = self.node_mut(id);
        let how = match node.running.as_mut()? {
            Running::Process(child) => child.try_wait().ok().flatten().map(|status| status.to_string()),
            Running::InProcess { task, .. } if task.is_finished() => {
                let Some(Running::InProcess { task, .. }) = node.running.take() else { unreachable!("matched above") };
                return Some(match task.await {
                    Ok(Ok(())) => "stopped".into(),
                    Ok(Err(e)) => format!("failed: {e}"),
                    Err(e) => format!("panicked: {e}"),
                });
            }
            Running::InProcess { .. } => None,
        };
        if how.is_some() {
            node.running = None;
        }
        how
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Mode::Process(_) = self.mode {
                let mut report = String::new();
                for id in self.ids() {
                    let _ = writeln!(report, "==== broker {id} log (last 60 lines) ====\n{}", self.log_tail(id, 60));
                }
                eprintln!("{report}");
            }
            // The data dirs and full logs, for a post-mortem when asked for.
            if std::env::var_os("FJORD_TEST_KEEP").is_some() {
                self.dir.disable_cleanup(true);
                eprintln!("FJORD_TEST_KEEP: cluster data and logs kept in {}", self.dir.path().display());
            }
        }
        for node in self.brokers.values_mut() {
            match node.running.take() {
                Some(Running::Process(mut child)) => {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                Some(Running::InProcess { shutdown, task }) => {
                    shutdown.cancel();
                    task.abort();
                }
                None => {}
            }
        }
    }
}

fn signal(child: &Child, signal: Signal) -> Result<()> {
    let pid = i32::try_from(child.id()).context("pid out of range")?;
    kill(Pid::from_raw(pid), signal).with_context(|| format!("{signal} to pid {pid}"))
}

/// A TOML basic string: keys with dots must be quoted, or TOML reads them as tables.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A chroot no other cluster on the same ZooKeeper uses.
fn unique_chroot() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("/fjord-test-{}-{}-{nanos}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// One ApiVersions v0 round trip, bounded by 2 s.
async fn api_versions(addr: &str) -> Result<()> {
    tokio::time::timeout(Duration::from_secs(2), async {
        let mut stream = TcpStream::connect(addr).await?;
        // size, api key 18, version 0, correlation id 1, client id "t".
        let mut frame = Vec::new();
        frame.extend_from_slice(&11i32.to_be_bytes());
        frame.extend_from_slice(&18i16.to_be_bytes());
        frame.extend_from_slice(&0i16.to_be_bytes());
        frame.extend_from_slice(&1i32.to_be_bytes());
        frame.extend_from_slice(&1i16.to_be_bytes());
        frame.push(b't');
        stream.write_all(&frame).await?;
        let len = stream.read_i32().await?;
        let correlation = stream.read_i32().await?;
        if len < 4 || correlation != 1 {
            bail!("unexpected ApiVersions answer (size {len}, correlation id {correlation})");
        }
        Ok(())
    })
    .await
    .map_err(|_| anyhow!("no ApiVersions answer from {addr} within 2 s"))?
}
