//! One broker in this process on the embedded metadata store, as `fjord broker` without
//! `--zookeeper` runs it: the in-process fixture of broker, client, gateway and CLI tests.
//!
//! [`StandaloneBroker::start`] is the quick default (one PLAINTEXT listener, data in a temp
//! dir); [`StandaloneBroker::builder`] covers the rest: named listeners (TLS, SASL), SCRAM
//! users and ACLs written before the broker serves, a data dir that outlives a restart, and
//! a clean [`StandaloneBroker::stop`] that returns what the broker's `run` returned.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use fjord_auth::acl::AclBinding;
use fjord_auth::scram::{ScramCredential, ScramMechanism};
use fjord_broker::BrokerConfig;
use fjord_coord::registry::{read_json, BrokerRegistration};
use fjord_coord::{paths, Store};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// SCRAM iterations of test users: Kafka's minimum, so logins stay cheap.
const SCRAM_ITERATIONS: u32 = 4096;

/// A broker running on the caller's tokio runtime. Dropping it starts its shutdown (and
/// deletes its temp dir); [`StandaloneBroker::stop`] waits for it.
pub struct StandaloneBroker {
    /// `127.0.0.1:PORT` of the first listener, the bootstrap address.
    pub addr: String,
    addrs: BTreeMap<String, SocketAddr>,
    store: Store,
    data_dir: PathBuf,
    shutdown: CancellationToken,
    task: Option<JoinHandle<fjord_broker::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
}

/// How a [`StandaloneBroker`] starts; see [`StandaloneBroker::builder`].
pub struct StandaloneBuilder {
    config: BrokerConfig,
    /// The first config key that did not parse, reported by `start`.
    invalid: Option<anyhow::Error>,
    data_dir: Option<PathBuf>,
    users: Vec<(String, String, Vec<ScramMechanism>)>,
    acls: Vec<AclBinding>,
    audit_tier: bool,
    store: Option<Store>,
}

impl StandaloneBroker {
    /// A broker with the default config and the audit's broker tier (what `fjord broker` runs).
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(|_| {}).await
    }

    /// A broker whose consumer groups form fast (100 ms initial rebalance delay) and accept
    /// 1 s sessions, so tests of group members can kill one and see it leave soon.
    pub async fn start_for_groups() -> anyhow::Result<Self> {
        Self::start_with(|config| {
            config.group.initial_rebalance_delay_ms = 100;
            config.group.min_session_timeout_ms = 1000;
        })
        .await
    }

    /// [`StandaloneBroker::start`] with the config adjusted by `configure`.
    pub async fn start_with(configure: impl FnOnce(&mut BrokerConfig)) -> anyhow::Result<Self> {
        Self::builder().configure(configure).audit_tier().start().await
    }

    /// A broker to describe before it starts: one PLAINTEXT listener on a free port, data
    /// in a temp dir, no audit tier, until told otherwise.
    pub fn builder() -> StandaloneBuilder {
        let mut config = BrokerConfig::default();
        let invalid = config.set("listeners", "PLAINTEXT://127.0.0.1:0").err().map(anyhow::Error::from);
        StandaloneBuilder { config, invalid, data_dir: None, users: Vec::new(), acls: Vec::new(), audit_tier: false, store: None }
    }

    /// The address of the listener named `name` (`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, ...).
    ///
    /// # Panics
    /// When the broker has no listener of that name: a mistake in the test itself.
    pub fn listener(&self, name: &str) -> SocketAddr {
        match self.addrs.get(name) {
            Some(addr) => *addr,
            None => panic!("the broker has no listener {name}; it has {:?}", self.addrs.keys().collect::<Vec<_>>()),
        }
    }

    /// The broker's metadata store (shared, as `fjord dev` shares it with the registry).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Where the broker keeps its logs and its embedded metadata store.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Shuts the broker down cleanly and returns what its `run` returned.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let Some(task) = self.task.take() else { return Ok(()) };
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .context("the broker did not stop within 30 s")?
            .context("the broker task panicked")?
            .context("the broker's run failed")
    }
}

impl Drop for StandaloneBroker {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl StandaloneBuilder {
    /// Sets a broker config key as a `fjord.toml` would (`listeners`, `authorizer.enable`, ...).
    pub fn set(mut self, key: &str, value: &str) -> Self {
        if let Err(e) = self.config.set(key, value) {
            self.invalid.get_or_insert(anyhow::Error::from(e).context(format!("broker config {key}={value}")));
        }
        self
    }

    /// Adjusts the config directly (log dir and listeners may be overridden here too).
    pub fn configure(mut self, configure: impl FnOnce(&mut BrokerConfig)) -> Self {
        configure(&mut self.config);
        self
    }

    /// Keeps the data in `dir` (created if missing, never deleted), so a test can stop the
    /// broker and start another on the same data.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// A SCRAM user with a credential for every mechanism.
    pub fn user(self, name: &str, password: &str) -> Self {
        self.user_with(name, password, &ScramMechanism::ALL)
    }

    /// A SCRAM user with credentials for `mechanisms` only.
    pub fn user_with(mut self, name: &str, password: &str, mechanisms: &[ScramMechanism]) -> Self {
        self.users.push((name.to_owned(), password.to_owned(), mechanisms.to_vec()));
        self
    }

    /// ACLs written to the store before the broker serves its first request.
    pub fn acls(mut self, acls: impl IntoIterator<Item = AclBinding>) -> Self {
        self.acls.extend(acls);
        self
    }

    /// Runs on `store` (another broker's, see [`StandaloneBroker::store`]) instead of its
    /// own embedded one: brokers of one cluster without ZooKeeper.
    pub fn shared_store(mut self, store: Store) -> Self {
        self.store = Some(store);
        self
    }

    /// Installs the audit's broker tier, as the `fjord broker` binary does.
    pub fn audit_tier(mut self) -> Self {
        self.audit_tier = true;
        self
    }

    /// Binds every listener, writes users and ACLs, starts the broker and returns once it
    /// has registered (it serves from then on).
    ///
    /// On a data dir given with [`StandaloneBuilder::data_dir`] (a restart), a lock of the
    /// dir found held is waited out for up to 10 s. The broker this test stopped released
    /// it, but a process another test of this binary spawned at that moment holds a copy
    /// of the lock's descriptor from its fork until its exec (milliseconds on a loaded
    /// machine); a broker process restarting has no such sibling.
    pub async fn start(mut self) -> anyhow::Result<StandaloneBroker> {
        if let Some(e) = self.invalid.take() {
            return Err(e);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.attempt().start_once().await {
                Err(e) if self.data_dir.is_some() && is_lock_held(&e) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                started => return started,
            }
        }
    }

    /// A copy of this description for one attempt at starting.
    fn attempt(&self) -> Self {
        Self {
            config: self.config.clone(),
            invalid: None,
            data_dir: self.data_dir.clone(),
            users: self.users.clone(),
            acls: self.acls.clone(),
            audit_tier: self.audit_tier,
            store: self.store.clone(),
        }
    }

    async fn start_once(self) -> anyhow::Result<StandaloneBroker> {
        let mut config = self.config;
        let (data_dir, temp) = match self.data_dir {
            Some(dir) => (dir, None),
            None => {
                let temp = tempfile::tempdir()?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        config.log_dir = data_dir.clone();
        if self.audit_tier {
            fjord_audit::BrokerTier::install(&mut config)?;
        }
        std::fs::create_dir_all(&data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
        let bound = fjord_broker::server::bind(&config).await?;
        let mut addrs = BTreeMap::new();
        for (listener, socket) in config.listeners.iter().zip(&bound) {
            addrs.insert(listener.name.clone(), socket.local_addr()?);
        }
        let addr = bound.first().context("the broker has no listener")?.local_addr()?.to_string();
        let store = match self.store {
            Some(store) => store,
            None => fjord_broker::server::open_store(&config).await?,
        };
        for (user, password, mechanisms) in &self.users {
            for &mechanism in mechanisms {
                let credential = ScramCredential::generate(mechanism, password, SCRAM_ITERATIONS)?;
                fjord_auth::store::set_credential(&*store, user, mechanism, &credential)
                    .await
                    .with_context(|| format!("writing the SCRAM credential of {user}"))?;
            }
        }
        if !self.acls.is_empty() {
            fjord_auth::store::create_acls(&*store, &self.acls).await.context("writing the ACLs")?;
        }
        let broker_id = config.broker_id;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(fjord_broker::server::run_listeners(config, store.clone(), bound, shutdown.clone()));
        let mut broker = StandaloneBroker { addr, addrs, store, data_dir, shutdown, task: Some(task), _dir: temp };
        broker.wait_registered(broker_id).await?;
        Ok(broker)
    }
}

/// Whether starting failed only because the metadata store's or the logs' lock of the data
/// dir was held.
fn is_lock_held(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        matches!(cause.downcast_ref::<fjord_coord::Error>(), Some(fjord_coord::Error::InUse { .. }))
            || matches!(cause.downcast_ref::<fjord_log::Error>(), Some(fjord_log::Error::InUse { .. }))
    })
}

impl StandaloneBroker {
    /// Waits for the broker's registration, its last step before serving; a broker that
    /// stopped instead reports why.
    async fn wait_registered(&mut self, broker_id: i32) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if read_json::<BrokerRegistration>(&*self.store, &paths::broker(broker_id)).await?.is_some() {
                return Ok(());
            }
            if self.task.as_ref().is_some_and(JoinHandle::is_finished) {
                let task = self.task.take().context("checked above")?;
                return match task.await {
                    Ok(Ok(())) => Err(anyhow::anyhow!("the broker stopped before it registered")),
                    Ok(Err(e)) => Err(anyhow::Error::from(e).context("the broker failed to start")),
                    Err(e) => Err(anyhow::Error::from(e).context("the broker task panicked")),
                };
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "the broker did not register within 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The whole HTTP answer (status line, headers, body) of `GET /metrics` from a broker's
/// metrics endpoint at `addr` (`metrics.listen`), for tests that count its samples.
pub async fn scrape_metrics(addr: SocketAddr) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").await?;
    let mut response = String::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_string(&mut response)).await??;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restart finds the data dir's locks held for a moment (as by a process spawned
    /// beside it, between its fork and exec): it waits them out instead of failing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_waits_out_a_lock_held_for_a_moment() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let broker = StandaloneBroker::builder().data_dir(&data).start().await.unwrap();
        broker.stop().await.unwrap();
        for lock in [data.join(fjord_broker::server::METADATA_DIR).join("lock"), data.join(fjord_log::LOCK_FILE)] {
            let held = std::fs::OpenOptions::new().write(true).open(&lock).unwrap();
            held.try_lock().unwrap();
            let release = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                drop(held);
            });
            let broker = StandaloneBroker::builder().data_dir(&data).start().await.unwrap();
            release.join().unwrap();
            broker.stop().await.unwrap();
        }
    }
}
