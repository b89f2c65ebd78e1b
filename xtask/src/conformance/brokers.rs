//! What the tests run against: `fjord dev`, or a ZooKeeper and three `fjord broker`
//! processes, each on free ports and stopped when dropped.

use std::fs;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use socket2::{Domain, Socket, Type};

use super::security::{add_scram_user, TlsFixtures};

/// The brokers' `log.min.segment.bytes`: the suite is written for Kafka 3.9, whose
/// `segment.bytes` may go down to 14 bytes, and 0077 and 0129 create topics with
/// 10000 and 20000 bytes, under Fjord's default floor of 1 MiB.
pub(super) const MIN_SEGMENT_BYTES: &str = "10000";

/// What the tests run against, stopped when dropped.
pub(super) trait Brokers {
    /// The PLAINTEXT listeners (the `kafka-topics.sh` stand-in's, and the tests' in a
    /// plaintext run).
    fn bootstrap(&self) -> &str;
    /// The SASL_SSL listeners, when the brokers were started with [`TlsFixtures`].
    fn sasl_ssl_bootstrap(&self) -> &str;
    /// The processes the run started, each with what it is and its log: what a failing
    /// run looks at first (did one of them exit, what did it log last).
    fn servers(&mut self) -> Vec<Server<'_>>;
}

/// One process a run started, as [`Brokers::servers`] lists it.
pub(super) struct Server<'a> {
    pub(super) what: String,
    pub(super) child: &'a mut Child,
    pub(super) log: PathBuf,
}

impl Server<'_> {
    /// How the process ended, when it has.
    pub(super) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

/// A loopback port for a server this run starts, held until xtask exits by a socket
/// bound to it but not listening (as fjord-testkit's `free_port`). Picked and let go at
/// once, the port could go to any other socket before its server bound it: `fjord dev`
/// itself failed so ("binding the gateway gRPC ...: Address already in use"), its own
/// connections to its broker, made before the gateway started, having been given the
/// gateway's port as their local one. Held with SO_REUSEADDR, Linux gives the port to
/// no port-0 bind and no outgoing connection, while the servers (which set
/// SO_REUSEADDR) still bind it.
pub(super) fn free_port() -> Result<u16> {
    static HELD: std::sync::Mutex<Vec<Socket>> = std::sync::Mutex::new(Vec::new());
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())?;
    let port = socket.local_addr()?.as_socket().context("a loopback socket has an IP address")?.port();
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push(socket);
    Ok(port)
}

/// `fjord dev` on free ports, stopped when dropped.
pub(super) struct DevBroker {
    child: Child,
    log: PathBuf,
    bootstrap: String,
    sasl_ssl_bootstrap: String,
    _data: TempDir,
}

impl DevBroker {
    pub(super) fn start(root: &Path, work: &Path, scenario: &str, security: Option<&TlsFixtures>) -> Result<Self> {
        let data = TempDir::new(work.join("data"))?;
        let port = free_port;
        let (broker, registry, http, grpc, metrics) = (port()?, port()?, port()?, port()?, port()?);
        let plaintext = format!("127.0.0.1:{broker}");
        let mut settings = vec![("listeners".to_owned(), format!("PLAINTEXT://{plaintext}"))];
        let mut sasl_ssl_bootstrap = String::new();
        if let Some(tls) = security {
            // The user goes into the embedded store before the broker opens it.
            add_scram_user(root, &["--data-dir".as_ref(), data.0.as_os_str()])?;
            sasl_ssl_bootstrap = format!("127.0.0.1:{}", port()?);
            settings = tls.broker_settings(&plaintext, &sasl_ssl_bootstrap);
        }
        let log_path = work.join("fjord-dev.log");
        let log = fs::File::create(&log_path)?;
        let mut command = Command::new(root.join("target/debug/fjord"));
        for (key, value) in &settings {
            command.env(format!("FJORD_{}", key.to_ascii_uppercase().replace('.', "_")), value);
        }
        let child = command
            .arg("dev")
            .arg("--data-dir")
            .arg(&data.0)
            .env("FJORD_DEV_REGISTRY", format!("127.0.0.1:{registry}"))
            .env("FJORD_DEV_HTTP", format!("127.0.0.1:{http}"))
            .env("FJORD_DEV_GRPC", format!("127.0.0.1:{grpc}"))
            .env("FJORD_DEV_METRICS", format!("127.0.0.1:{metrics}"))
            // The suite's scenarios: 4 partitions per auto-created topic.
            .env("FJORD_NUM_PARTITIONS", "4")
            .env("FJORD_LOG_MIN_SEGMENT_BYTES", MIN_SEGMENT_BYTES)
            // For the ACL tests (0109, 0115, 0119): their ACLs are enforced, and where
            // none is set everyone may do everything, as without an authorizer.
            .env("FJORD_AUTHORIZER_ENABLE", "true")
            .env("FJORD_ALLOW_EVERYONE_IF_NO_ACL_FOUND", "true")
            .env("FJORD_AUTO_CREATE_TOPICS_ENABLE", if scenario == "noautocreate" { "false" } else { "true" })
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting fjord dev")?;
        let mut dev = Self { child, log: log_path, bootstrap: plaintext, sasl_ssl_bootstrap, _data: data };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(&dev.bootstrap).is_err() {
            if let Some(status) = dev.child.try_wait()? {
                bail!("fjord dev exited ({status}); see {}", dev.log.display());
            }
            if Instant::now() > deadline {
                bail!("fjord dev did not listen on {} within 60 s", dev.bootstrap);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(dev)
    }
}

impl Brokers for DevBroker {
    fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    fn sasl_ssl_bootstrap(&self) -> &str {
        &self.sasl_ssl_bootstrap
    }

    fn servers(&mut self) -> Vec<Server<'_>> {
        vec![Server { what: "fjord dev".into(), child: &mut self.child, log: self.log.clone() }]
    }
}

impl Drop for DevBroker {
    fn drop(&mut self) {
        // The data goes with the temporary directory.
        stop(&mut self.child);
    }
}

/// SIGTERM for a clean stop, SIGKILL after 20 s.
pub(super) fn stop(child: &mut Child) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Debian's ZooKeeper (the `zookeeper` package `cargo xtask provision` installs).
pub(super) const ZOOKEEPER_CLASSPATH: &str = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";
/// The cluster's size, as in `deploy/cluster`.
pub(super) const CLUSTER_BROKERS: i32 = 3;

/// A ZooKeeper and three `fjord broker` processes on free ports, all stopped when
/// dropped (brokers first, so none is left without its ZooKeeper).
pub(super) struct ClusterBrokers {
    zookeeper: Child,
    brokers: Vec<Child>,
    /// ZooKeeper's log, then each broker's.
    logs: Vec<PathBuf>,
    bootstrap: String,
    sasl_ssl_bootstrap: String,
    _data: TempDir,
}

impl ClusterBrokers {
    pub(super) fn start(root: &Path, work: &Path, scenario: &str, security: Option<&TlsFixtures>) -> Result<Self> {
        if !Path::new("/usr/share/java/zookeeper.jar").exists() {
            bail!("ZooKeeper is not installed: `cargo xtask provision` installs Debian's zookeeper package");
        }
        let data = TempDir::new(work.join("data"))?;
        let zk_port = free_port()?;
        let zk_config = data.0.join("zoo.cfg");
        fs::write(
            &zk_config,
            format!(
                "tickTime=500\ndataDir={}\nclientPort={zk_port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr\nmaxSessionTimeout=60000\n",
                data.0.join("zookeeper").display()
            ),
        )?;
        let zk_log_path = work.join("zookeeper.log");
        let zk_log = fs::File::create(&zk_log_path)?;
        let zookeeper = Command::new("java")
            .args(["-Xmx256m", "-cp", ZOOKEEPER_CLASSPATH, "org.apache.zookeeper.server.ZooKeeperServerMain"])
            .arg(&zk_config)
            .stdin(Stdio::null())
            .stdout(zk_log.try_clone()?)
            .stderr(zk_log)
            .spawn()
            .context("starting ZooKeeper (java)")?;
        let mut cluster = Self {
            zookeeper,
            brokers: Vec::new(),
            logs: vec![zk_log_path.clone()],
            bootstrap: String::new(),
            sasl_ssl_bootstrap: String::new(),
            _data: data,
        };
        wait_zookeeper(zk_port, &mut cluster.zookeeper, &zk_log_path)?;
        let zookeeper_connect = format!("127.0.0.1:{zk_port}/fjord");
        if security.is_some() {
            add_scram_user(root, &["--zookeeper".as_ref(), zookeeper_connect.as_ref()])?;
        }
        let mut addresses = Vec::new();
        let mut sasl_ssl_addresses = Vec::new();
        for id in 1..=CLUSTER_BROKERS {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let listeners = match security {
                None => vec![("listeners".to_owned(), format!("PLAINTEXT://{addr}"))],
                Some(tls) => {
                    let sasl_ssl = format!("127.0.0.1:{}", free_port()?);
                    let settings = tls.broker_settings(&addr, &sasl_ssl);
                    sasl_ssl_addresses.push(sasl_ssl);
                    settings
                }
            };
            let listeners: String = listeners.iter().map(|(k, v)| format!("{k:?} = {v:?}\n")).collect();
            let config = cluster._data.0.join(format!("broker-{id}.toml"));
            fs::write(
                &config,
                format!(
                    "\"broker.id\" = {id}\n{listeners}\
                     \"zookeeper.connect\" = \"{zookeeper_connect}\"\n\
                     \"num.partitions\" = 4\n\"default.replication.factor\" = 3\n\"min.insync.replicas\" = 1\n\
                     \"log.min.segment.bytes\" = {MIN_SEGMENT_BYTES}\n\
                     \"authorizer.enable\" = true\n\"allow.everyone.if.no.acl.found\" = true\n\
                     \"auto.create.topics.enable\" = {}\n",
                    scenario != "noautocreate"
                ),
            )?;
            let log_path = work.join(format!("broker-{id}.log"));
            let log = fs::File::create(&log_path)?;
            let child = Command::new(root.join("target/debug/fjord"))
                .args(["broker", "--config"])
                .arg(&config)
                .arg("--data-dir")
                .arg(cluster._data.0.join(format!("broker-{id}")))
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting fjord broker")?;
            cluster.brokers.push(child);
            cluster.logs.push(log_path.clone());
            addresses.push((addr, log_path));
        }
        for (i, (addr, log)) in addresses.iter().enumerate() {
            wait_listening(addr, &mut cluster.brokers[i], &format!("broker {}", i + 1), log)?;
        }
        cluster.bootstrap = addresses.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>().join(",");
        cluster.sasl_ssl_bootstrap = sasl_ssl_addresses.join(",");
        // A broker listens only once it has registered; wait until the first one's
        // metadata lists all three, so no test starts against a partial cluster.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match metadata_broker_count(&addresses[0].0) {
                Ok(n) if n == CLUSTER_BROKERS => break,
                Ok(_) | Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
                Ok(n) => bail!("the cluster's metadata lists {n} of {CLUSTER_BROKERS} brokers after 60 s"),
                Err(e) => return Err(e.context("Metadata from broker 1")),
            }
        }
        Ok(cluster)
    }
}

impl Brokers for ClusterBrokers {
    fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    fn sasl_ssl_bootstrap(&self) -> &str {
        &self.sasl_ssl_bootstrap
    }

    fn servers(&mut self) -> Vec<Server<'_>> {
        let names = std::iter::once("ZooKeeper".to_owned()).chain((1..=CLUSTER_BROKERS).map(|id| format!("broker {id}")));
        let children = std::iter::once(&mut self.zookeeper).chain(self.brokers.iter_mut());
        names.zip(children).zip(&self.logs).map(|((what, child), log)| Server { what, child, log: log.clone() }).collect()
    }
}

impl Drop for ClusterBrokers {
    fn drop(&mut self) {
        for child in &mut self.brokers {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
        }
        for child in &mut self.brokers {
            stop(child);
        }
        stop(&mut self.zookeeper);
    }
}

/// Waits until ZooKeeper answers `srvr` with its mode: it accepts connections before
/// it serves, and a broker that connects then loses its session at once.
pub(super) fn wait_zookeeper(port: u16, child: &mut Child, log: &Path) -> Result<()> {
    use std::io::Write;
    let serving = || -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut answer = String::new();
        stream.write_all(b"srvr").is_ok() && stream.read_to_string(&mut answer).is_ok() && answer.contains("Mode:")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !serving() {
        if let Some(status) = child.try_wait()? {
            bail!("ZooKeeper exited ({status}); see {}", log.display());
        }
        if Instant::now() > deadline {
            bail!("ZooKeeper did not serve on port {port} within 60 s; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Waits until `addr` accepts connections, failing early when `child` exits.
pub(super) fn wait_listening(addr: &str, child: &mut Child, what: &str, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited ({status}); see {}", log.display());
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on {addr} within 60 s; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The number of brokers in a Metadata v0 answer (all topics) from `addr`.
pub(super) fn metadata_broker_count(addr: &str) -> Result<i32> {
    use std::io::Write;
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    // api_key 3 (Metadata), version 0, correlation id 1, client id "xtask", no topics
    // (v0: an empty list means all).
    let mut body = Vec::new();
    body.extend_from_slice(&3i16.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&1i32.to_be_bytes());
    body.extend_from_slice(&5i16.to_be_bytes());
    body.extend_from_slice(b"xtask");
    body.extend_from_slice(&0i32.to_be_bytes());
    let mut request = (body.len() as i32).to_be_bytes().to_vec();
    request.extend_from_slice(&body);
    stream.write_all(&request)?;
    // Size, correlation id, then the broker array's length.
    let mut head = [0u8; 12];
    stream.read_exact(&mut head)?;
    Ok(i32::from_be_bytes([head[8], head[9], head[10], head[11]]))
}

/// A directory removed when dropped.
pub(super) struct TempDir(PathBuf);

impl TempDir {
    fn new(path: PathBuf) -> Result<Self> {
        super::fresh_dir(&path)?;
        Ok(Self(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
