//! Real parts for integration tests, on loopback, each in its own temp directory.
//!
//! # Layout
//! - [`ZooKeeper`] (this file): a standalone ZooKeeper server from Debian's `zookeeper`
//!   package (`cargo xtask test` installs it), on a free port, stopped and deleted on drop.
//! - [`Cluster`] (`cluster`): ZooKeeper + N brokers, as child processes of the `fjord`
//!   binary (kill -9, SIGSTOP/SIGCONT, restart on the same data dir) or in process;
//!   leaders, ISRs and the controller read from ZooKeeper; one plaintext listener each,
//!   or named listeners ([`ClusterBuilder::sasl_ssl`]: SASL_SSL for clients and between
//!   brokers, ACLs on).
//! - [`StandaloneBroker`] (`standalone`): one in-process broker on the embedded store.
//! - [`Tmpfs`] (`tmpfs`): a small tmpfs mounted for one test (root), a disk that fills up.
//! - [`Certs`] (`certs`): a test CA, server key store and client certificate (openssl).
//! - [`wait_until`] (`wait`): poll a condition with a deadline instead of sleeping.
//! - [`python`] and [`node_modules`] (`script`): where the tests find the Python clients
//!   and KafkaJS, and [`ClientScript`] / [`run_python`] / [`run_node`], one script of
//!   them run with its output read as it comes.
//! - `damage` (through `fjord-client`): a log of many small segments on three scrubbing
//!   brokers ([`scrubbing_cluster`], [`fill_segmented_topic`]), one byte of it flipped
//!   ([`flip_in_place`]), its segments ([`segments`]) and the side directories the damaged
//!   bytes go to ([`damaged_aside`]).
//! - `records` (through `fjord-client`): numbered records sent across a fault
//!   ([`stream_across`]) or in rounds ([`produce_round`]), a partition read back
//!   ([`read_values`]).
//! - [`LoadProducer`] (`load`, through `fjord-client`): a producer writing without pause
//!   while partitions move under it, keeping which records were acknowledged ([`Load`]).
//!
//! A test that needs one of these never skips: if it cannot start, it fails and says why.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

mod certs;
pub mod chaos;
mod cluster;
mod damage;
mod load;
mod records;
mod script;
mod standalone;
mod tmpfs;
mod wait;

pub use certs::Certs;
pub use cluster::{Cluster, ClusterBuilder, SecureCluster, SECURE_ADMIN};
pub use damage::{
    acks_all_producer, damaged_aside, fill_segmented_topic, flip_in_place, produce_acked_rounds, scrubbing_cluster, segments,
};
pub use load::{Load, LoadProducer};
pub use records::{numbered, produce_round, read_values, round_value, stream_across};
pub use script::{node_modules, python, run_node, run_python, ClientScript, ScriptOutput};
pub use standalone::{scrape_metrics, StandaloneBroker};
pub use tmpfs::Tmpfs;
pub use wait::wait_until;

/// Where Debian's package puts the server jar and its dependencies.
pub(crate) const ZOOKEEPER_CLASSPATH: &str = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";

/// A standalone ZooKeeper server for one test.
#[derive(Debug)]
pub struct ZooKeeper {
    process: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl ZooKeeper {
    /// Starts a server on a free loopback port and waits until it serves.
    pub fn start() -> Result<Self> {
        if !Path::new("/usr/share/java/zookeeper.jar").exists() {
            bail!("ZooKeeper is not installed (/usr/share/java/zookeeper.jar missing): run `cargo xtask test`, which installs Debian's zookeeper package");
        }
        // A server that does not come up (exited or silent past the wait) is replaced by
        // one on another port, three tries in all: the JVM binds its port a second after
        // the pick, and before ports were held (`free_port`) another socket could take it.
        let mut attempts = 1;
        loop {
            match Self::start_once() {
                Err(e) if attempts < 3 => {
                    eprintln!("ZooKeeper did not start (attempt {attempts}), trying another port: {e:#}");
                    attempts += 1;
                }
                result => return result,
            }
        }
    }

    fn start_once() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let config = dir.path().join("zoo.cfg");
        std::fs::write(
            &config,
            format!(
                "tickTime=500\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr\n\
                 minSessionTimeout=1000\nmaxSessionTimeout=60000\n",
                dir.path().join("data").display()
            ),
        )?;
        let process = Self::spawn(dir.path())?;
        let mut server = Self { process, port, dir };
        server.wait_until_serving(Duration::from_secs(30))?;
        Ok(server)
    }

    /// The server process on the config and data in `dir`, its output appended to the log.
    fn spawn(dir: &Path) -> Result<Child> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("zookeeper.log"))?;
        Command::new("java")
            .args(["-Xmx256m", "-cp", ZOOKEEPER_CLASSPATH, "org.apache.zookeeper.server.ZooKeeperServerMain"])
            .arg(dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("could not start java for ZooKeeper")
    }

    /// SIGKILL: the ensemble is gone, connections to it refused, until
    /// [`ZooKeeper::restart`]; its data stays.
    pub fn kill(&mut self) -> Result<()> {
        self.process.kill()?;
        self.process.wait()?;
        Ok(())
    }

    /// Starts the server again after [`ZooKeeper::kill`], on the same port and data
    /// (sessions older than their timeout have expired), and waits until it serves.
    pub fn restart(&mut self) -> Result<()> {
        self.process = Self::spawn(self.dir.path())?;
        self.wait_until_serving(Duration::from_secs(30))
    }

    /// `127.0.0.1:PORT`, without a chroot.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGSTOP: the server keeps its sockets but answers nothing and lets no session
    /// expire while stopped; every client sees ZooKeeper gone silent (a partition, a GC
    /// pause). Sessions whose time ran out meanwhile expire once it resumes.
    pub fn pause(&self) -> Result<()> {
        self.signal(nix::sys::signal::Signal::SIGSTOP)
    }

    /// SIGCONT after [`ZooKeeper::pause`].
    pub fn resume(&self) -> Result<()> {
        self.signal(nix::sys::signal::Signal::SIGCONT)
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        let pid = i32::try_from(self.process.id()).context("pid out of range")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .with_context(|| format!("{signal} to ZooKeeper (pid {pid})"))
    }

    fn wait_until_serving(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.process.try_wait()? {
                let log = std::fs::read_to_string(self.dir.path().join("zookeeper.log")).unwrap_or_default();
                bail!("ZooKeeper exited with {status} before serving:\n{log}");
            }
            if self.four_letter("srvr").map(|r| r.contains("Mode:")).unwrap_or(false) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("ZooKeeper did not serve on port {} within {timeout:?}", self.port)
    }

    /// Sends one of ZooKeeper's four-letter commands and returns the answer.
    pub fn four_letter(&self, command: &str) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(command.as_bytes())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    }
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A loopback port for a server the test starts, held for the rest of this process by a
/// socket bound to it but not listening (`reserve_port`). Picked and let go at once, a
/// port can be handed to any other socket on the machine before its server binds it
/// (CI saw a broker's port taken so); held, Linux gives it to no port-0 bind and no
/// outgoing connection, while servers still bind it (tokio's, std's and Java NIO's
/// listeners set SO_REUSEADDR: the brokers, gateways, registries and ZooKeeper tests
/// start). A connection to it while nothing listens is refused, as to a free port.
pub fn free_port() -> Result<u16> {
    static HELD: std::sync::Mutex<Vec<tokio::net::TcpSocket>> = std::sync::Mutex::new(Vec::new());
    let socket = reserve_port(0)?;
    let port = socket.local_addr()?.port();
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push(socket);
    Ok(port)
}

/// A loopback TCP socket bound to `port` (0: any free one) but not listening, with
/// SO_REUSEADDR, which lets a server bind the port while it is held; Linux picks no port
/// with such a socket for a port-0 bind or an outgoing connection.
pub(crate) fn reserve_port(port: u16) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))?;
    Ok(socket)
}
