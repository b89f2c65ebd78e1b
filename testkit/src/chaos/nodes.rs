//! ZooKeeper and the brokers of a chaos run, each a process in its own namespace
//! (`ip netns exec`, which execs the program: the child's pid is the server's, so
//! SIGKILL and SIGSTOP reach it). Brokers listen on their bridge address; every
//! connection to a broker (from the clients or another broker) goes through the
//! [`DelayProxy`] of the namespace it starts in, the latency fault's lever.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::netns::Network;
use super::proxy::{DelayProxy, Delays};
use crate::{Tmpfs, ZOOKEEPER_CLASSPATH};

/// The broker port, the same in every namespace.
pub const BROKER_PORT: u16 = 9092;
const ZOOKEEPER_PORT: u16 = 2181;
/// Where each namespace's delaying proxy listens.
const PROXY_PORT: u16 = 19092;
/// Short, so a cut-off broker loses its session in seconds.
pub const SESSION_TIMEOUT_MS: u64 = 3000;
/// Size of the tmpfs that is the disk-fault broker's data dir.
const DISK_MIB: u32 = 128;

/// One broker: its place (namespace, data dir, log) and its run, if any.
struct Broker {
    id: i32,
    label: String,
    data_dir: PathBuf,
    log_file: PathBuf,
    config_file: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// The small disk of the broker the `disk` fault fills.
    tmpfs: Option<Tmpfs>,
}

/// ZooKeeper and brokers in namespaces. Dropping it kills every process; the
/// [`Network`] it holds is deleted after them.
pub struct Nodes {
    brokers: Vec<Broker>,
    delays: Arc<Delays>,
    proxies: Vec<DelayProxy>,
    zookeeper: Option<Child>,
    fjord: PathBuf,
    zk_connect: String,
    dir: tempfile::TempDir,
    // Last: the namespaces go once the processes in them are gone.
    pub net: Network,
}

impl Nodes {
    /// Starts ZooKeeper in namespace `zk` and brokers `b0..` in theirs; broker
    /// `disk_broker` gets a small tmpfs as its data dir.
    pub fn start(
        net: Network,
        fjord: &Path,
        brokers: usize,
        disk_broker: Option<i32>,
        configs: &[(&str, String)],
    ) -> Result<Self> {
        if !Path::new("/usr/share/java/zookeeper.jar").exists() {
            bail!(
                "ZooKeeper is not installed (/usr/share/java/zookeeper.jar missing): run `cargo xtask test`, which installs it"
            );
        }
        let dir = tempfile::Builder::new().prefix("fjord-chaos-").tempdir()?;
        let zk_ip = net.node("zk")?.ip.clone();
        let mut nodes = Self {
            brokers: Vec::new(),
            delays: Arc::new(Delays::default()),
            proxies: Vec::new(),
            zookeeper: None,
            fjord: fjord.to_owned(),
            zk_connect: format!("{zk_ip}:{ZOOKEEPER_PORT}"),
            dir,
            net,
        };
        nodes.start_zookeeper()?;
        for id in 0..brokers as i32 {
            let label = format!("b{id}");
            let tmpfs = if disk_broker == Some(id) { Some(Tmpfs::mount(DISK_MIB)?) } else { None };
            let data_dir = match &tmpfs {
                Some(t) => t.path().join("data"),
                None => nodes.dir.path().join(format!("broker-{id}")),
            };
            std::fs::create_dir_all(&data_dir)?;
            let mut toml = String::new();
            for (key, value) in configs {
                let _ = writeln!(toml, "{key:?} = {value:?}");
            }
            let _ = writeln!(toml, "\"zookeeper.session.timeout.ms\" = \"{SESSION_TIMEOUT_MS}\"");
            let config_file = nodes.dir.path().join(format!("broker-{id}.toml"));
            std::fs::write(&config_file, toml)?;
            nodes.brokers.push(Broker {
                id,
                label,
                log_file: nodes.dir.path().join(format!("broker-{id}.log")),
                data_dir,
                config_file,
                child: None,
                paused: false,
                tmpfs,
            });
        }
        // A proxy in every namespace that opens connections to brokers.
        let mut clients: Vec<String> = (0..brokers).map(|b| format!("b{b}")).collect();
        clients.push("clients".into());
        for label in clients {
            let node = nodes.net.node(&label)?.clone();
            let listen = SocketAddrV4::new(node.ip.parse()?, PROXY_PORT);
            nodes.proxies.push(DelayProxy::start(&node.netns, listen, nodes.delays.clone())?);
            nodes.net.intercept(&label, BROKER_PORT, &listen.to_string())?;
        }
        for id in 0..brokers as i32 {
            nodes.launch(id)?;
        }
        Ok(nodes)
    }

    fn start_zookeeper(&mut self) -> Result<()> {
        let zk = self.net.node("zk")?.clone();
        let config = self.dir.path().join("zoo.cfg");
        std::fs::write(
            &config,
            format!(
                "tickTime=500\ndataDir={}\nclientPort={ZOOKEEPER_PORT}\nclientPortAddress={}\n\
                 admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr\n\
                 minSessionTimeout=1000\nmaxSessionTimeout=60000\n",
                self.dir.path().join("zookeeper").display(),
                zk.ip
            ),
        )?;
        let log = std::fs::File::create(self.dir.path().join("zookeeper.log"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &zk.netns, "java", "-Xmx256m", "-cp", ZOOKEEPER_CLASSPATH])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("could not start ZooKeeper in its namespace")?;
        self.zookeeper = Some(child);
        // Brokers that find no ZooKeeper exit: start them once it serves.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.zookeeper.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let log = std::fs::read_to_string(self.dir.path().join("zookeeper.log")).unwrap_or_default();
                bail!("ZooKeeper exited with {status} before serving:\n{log}");
            }
            if four_letter(&self.zk_connect, "srvr").is_ok_and(|r| r.contains("Mode:")) {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                bail!("ZooKeeper did not serve on {} within 60 s", self.zk_connect);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `host:port` of ZooKeeper.
    pub fn zookeeper_connect(&self) -> &str {
        &self.zk_connect
    }

    /// Broker ids.
    pub fn ids(&self) -> Vec<i32> {
        self.brokers.iter().map(|b| b.id).collect()
    }

    /// The bootstrap list (every broker's advertised address).
    pub fn bootstrap(&self) -> String {
        self.brokers
            .iter()
            .filter_map(|b| self.net.node(&b.label).ok().map(|n| format!("{}:{BROKER_PORT}", n.ip)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Namespace label of broker `id`.
    pub fn label(&self, id: i32) -> String {
        format!("b{id}")
    }

    fn broker(&mut self, id: i32) -> Result<&mut Broker> {
        self.brokers.iter_mut().find(|b| b.id == id).ok_or_else(|| anyhow!("no broker {id}"))
    }

    /// Starts broker `id` (not waiting until it serves).
    pub fn launch(&mut self, id: i32) -> Result<()> {
        let (fjord, zk) = (self.fjord.clone(), self.zk_connect.clone());
        let netns = self.net.node(&self.label(id))?.netns.clone();
        let ip = self.net.node(&self.label(id))?.ip.clone();
        let broker = self.broker(id)?;
        if broker.child.is_some() {
            bail!("broker {id} is already running");
        }
        let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&broker.log_file)?;
        writeln!(log, "---- fjord broker {id} starting ----")?;
        let child = Command::new("ip")
            .args(["netns", "exec", &netns])
            .arg(&fjord)
            .args(["broker", "--config"])
            .arg(&broker.config_file)
            .args(["--id", &id.to_string(), "--listen", &format!("{ip}:{BROKER_PORT}")])
            .args(["--zookeeper", &zk, "--data-dir"])
            .arg(&broker.data_dir)
            .env("RUST_LOG", std::env::var("FJORD_CHAOS_BROKER_LOG").unwrap_or_else(|_| "info".into()))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting broker {id} ({})", fjord.display()))?;
        broker.child = Some(child);
        broker.paused = false;
        Ok(())
    }

    /// `kill -9` of broker `id`.
    pub fn kill(&mut self, id: i32) -> Result<()> {
        let broker = self.broker(id)?;
        let Some(mut child) = broker.child.take() else { bail!("broker {id} is not running") };
        let _ = child.kill();
        child.wait()?;
        broker.paused = false;
        Ok(())
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to broker `id`.
    pub fn pause(&mut self, id: i32, stop: bool) -> Result<()> {
        let broker = self.broker(id)?;
        let Some(child) = &broker.child else { bail!("broker {id} is not running") };
        let pid = Pid::from_raw(i32::try_from(child.id())?);
        kill(pid, if stop { Signal::SIGSTOP } else { Signal::SIGCONT })?;
        broker.paused = stop;
        Ok(())
    }

    /// Delays every connection from and to broker `id`.
    pub fn set_delay(&mut self, id: i32, delay: Duration) -> Result<()> {
        let ip = self.net.node(&self.label(id))?.ip.parse()?;
        self.delays.set(ip, delay);
        Ok(())
    }

    /// Whether broker `id` has the small disk.
    pub fn has_disk(&self, id: i32) -> bool {
        self.brokers.iter().any(|b| b.id == id && b.tmpfs.is_some())
    }

    /// Fills broker `id`'s small disk (`true`) or frees it (`false`).
    pub fn fill_disk(&mut self, id: i32, full: bool) -> Result<()> {
        let broker = self.broker(id)?;
        let Some(tmpfs) = &broker.tmpfs else { bail!("broker {id} has no small disk") };
        if full {
            tmpfs.fill("filler")?;
        } else {
            let path = tmpfs.path().join("filler");
            if path.exists() {
                std::fs::remove_file(path)?;
            }
        }
        Ok(())
    }

    /// Resumes paused brokers, restarts those that are down (killed, or exited on their
    /// own: returned with how they ended), and removes every delay.
    pub fn restore(&mut self) -> Result<Vec<String>> {
        let mut exited = Vec::new();
        self.delays.clear();
        for id in self.ids() {
            let broker = self.broker(id)?;
            if broker.paused {
                self.pause(id, false)?;
            }
            let broker = self.broker(id)?;
            let status = match broker.child.as_mut() {
                Some(child) => child.try_wait()?,
                None => None,
            };
            if let Some(status) = status {
                self.broker(id)?.child = None;
                // Why it ended is in its last lines; the logs themselves go with the run.
                exited.push(format!("broker {id} exited on its own ({status}); its log ended:\n{}", self.log_tail(id, 6)));
            }
            if self.broker(id)?.child.is_none() {
                self.launch(id)?;
            }
        }
        Ok(exited)
    }

    /// The last lines of broker `id`'s log.
    pub fn log_tail(&self, id: i32, lines: usize) -> String {
        let Some(broker) = self.brokers.iter().find(|b| b.id == id) else { return String::new() };
        let text = std::fs::read_to_string(&broker.log_file).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Where the logs are (kept with `FJORD_TEST_KEEP`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Keeps the data dirs and logs after the run.
    pub fn keep(&mut self) {
        self.dir.disable_cleanup(true);
    }
}

/// One of ZooKeeper's four-letter commands (from the calling thread's namespace).
fn four_letter(addr: &str, command: &str) -> std::io::Result<String> {
    use std::io::Read;
    let addr: SocketAddr = addr.parse().map_err(std::io::Error::other)?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(command.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for broker in &mut self.brokers {
            if let Some(mut child) = broker.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if let Some(mut zk) = self.zookeeper.take() {
            let _ = zk.kill();
            let _ = zk.wait();
        }
    }
}
