//! The ZooKeeper backend, over the `zookeeper-client` crate.
//!
//! A handle owns one ZooKeeper session at a time. When the session expires, the
//! operation that saw it fails with [`Error::SessionExpired`], every outstanding watch
//! resolves to [`WatchEvent::SessionLost`], and the next operation opens a new
//! session: callers re-register their ephemerals and re-read what they watched, so
//! nothing acts on a view from the dead session.
//!
//! While the ensemble cannot be reached, opening a session is tried at most once per
//! `Reconnect` pause (doubling from 250 ms to 4 s); operations in between fail at once
//! with [`Error::ConnectionLoss`]. A broker has a retrying reader per partition and
//! topic: each opening its own session, a 400-partition broker without its ZooKeeper
//! made ~1,000 connection attempts and logged ~2,000 lines a second. The outage is
//! logged here, once when it begins, every minute while it lasts and once when it ends.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::RwLock;
use zookeeper_client as zk;

use crate::{CreateMode, Error, MetadataStore, Result, Stat, Watch, WatchEvent};

/// Default session timeout, as in Kafka's `zookeeper.session.timeout.ms`.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(18);

/// A metadata store on a ZooKeeper ensemble, under a chroot.
#[derive(Debug)]
pub struct ZooKeeperStore {
    hosts: String,
    chroot: String,
    session_timeout: Duration,
    client: RwLock<zk::Client>,
    reconnect: Mutex<Reconnect>,
}

/// The first pause after a failed attempt to open a session, and the longest.
const RECONNECT_FIRST: Duration = Duration::from_millis(250);
const RECONNECT_MAX: Duration = Duration::from_secs(4);
/// How often an outage that goes on is logged again.
const OUTAGE_LOG_EVERY: Duration = Duration::from_secs(60);

/// The attempts to open a new session while the ensemble cannot be reached.
#[derive(Debug, Default)]
struct Reconnect {
    /// Since when no session could be opened (`None`: none failed since the last one).
    outage_since: Option<Instant>,
    failed_attempts: u32,
    /// No attempt before this.
    next_attempt: Option<Instant>,
    last_logged: Option<Instant>,
}

impl Reconnect {
    /// Whether an attempt may be made at `now`.
    fn may_try(&self, now: Instant) -> bool {
        self.next_attempt.is_none_or(|at| now >= at)
    }

    /// An attempt failed at `now`: the next one waits twice as long as the last pause
    /// (up to [`RECONNECT_MAX`]). Returns whether to log it: the first failure of an
    /// outage, then once every [`OUTAGE_LOG_EVERY`].
    fn failed(&mut self, now: Instant) -> bool {
        self.outage_since.get_or_insert(now);
        let pause = RECONNECT_FIRST.saturating_mul(1 << self.failed_attempts.min(8)).min(RECONNECT_MAX);
        self.failed_attempts += 1;
        self.next_attempt = Some(now + pause);
        let log = self.last_logged.is_none_or(|at| now.duration_since(at) >= OUTAGE_LOG_EVERY);
        if log {
            self.last_logged = Some(now);
        }
        log
    }

    /// A session was opened: how long the outage lasted and how many attempts failed,
    /// if there was one.
    fn succeeded(&mut self, now: Instant) -> Option<(Duration, u32)> {
        let outage = self.outage_since.take().map(|since| (now.duration_since(since), self.failed_attempts));
        *self = Reconnect::default();
        outage
    }
}

impl ZooKeeperStore {
    /// Connects to `connect` (`host:port[,host:port...][/chroot]`, optionally prefixed
    /// with `zk://`); the chroot defaults to `/fjord` and is created when missing.
    pub async fn connect(connect: &str, session_timeout: Duration) -> Result<Self> {
        let connect = connect.strip_prefix("zk://").unwrap_or(connect);
        let (hosts, chroot) = match connect.find('/') {
            Some(at) => (&connect[..at], &connect[at..]),
            None => (connect, crate::paths::DEFAULT_CHROOT),
        };
        if hosts.is_empty() {
            return Err(Error::ZooKeeper(format!("no ZooKeeper host in {connect:?}")));
        }
        crate::validate_path(chroot)?;
        let store = Self {
            hosts: hosts.to_string(),
            chroot: chroot.to_string(),
            session_timeout,
            client: RwLock::new(Self::new_session(hosts, chroot, session_timeout).await?),
            reconnect: Mutex::default(),
        };
        Ok(store)
    }

    async fn new_session(hosts: &str, chroot: &str, session_timeout: Duration) -> Result<zk::Client> {
        let connector = || zk::Client::connector().with_session_timeout(session_timeout).with_fail_eagerly();
        let root = connector().connect(hosts).await.map_err(|e| map_error(e, hosts))?;
        if chroot != "/" {
            let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            match root.mkdir(chroot, &options).await {
                Ok(()) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(map_error(e, chroot)),
            }
        }
        connector().connect(&format!("{hosts}{}", if chroot == "/" { "" } else { chroot })).await.map_err(|e| map_error(e, hosts))
    }

    /// The current client, replacing it first if its session has ended; while no new
    /// session can be opened, [`Error::ConnectionLoss`] at once between the attempts
    /// (see [`Reconnect`]).
    async fn client(&self) -> Result<zk::Client> {
        let client = self.client.read().await.clone();
        if !client.state().is_terminated() {
            return Ok(client);
        }
        let mut slot = self.client.write().await;
        if !slot.state().is_terminated() {
            return Ok(slot.clone());
        }
        let now = Instant::now();
        let first = {
            let reconnect = self.reconnect.lock().unwrap_or_else(|e| e.into_inner());
            if !reconnect.may_try(now) {
                return Err(Error::ConnectionLoss);
            }
            reconnect.outage_since.is_none()
        };
        if first {
            tracing::warn!(session = slot.session_id().0, "ZooKeeper session ended; opening a new one");
        }
        match Self::new_session(&self.hosts, &self.chroot, self.session_timeout).await {
            Ok(client) => {
                *slot = client;
                let outage = self.reconnect.lock().unwrap_or_else(|e| e.into_inner()).succeeded(Instant::now());
                if let Some((lasted, attempts)) = outage {
                    tracing::info!(session = slot.session_id().0, ?lasted, attempts, "ZooKeeper session opened again");
                }
                Ok(slot.clone())
            }
            Err(e) => {
                let mut reconnect = self.reconnect.lock().unwrap_or_else(|e| e.into_inner());
                if reconnect.failed(Instant::now()) {
                    let since = reconnect.outage_since.map(|at| at.elapsed()).unwrap_or_default();
                    tracing::warn!(hosts = %self.hosts, error = %e, unreachable_for = ?since, attempts = reconnect.failed_attempts,
                        "cannot open a ZooKeeper session; retrying after pauses of up to {:?} (logged once a minute)", RECONNECT_MAX);
                }
                Err(e)
            }
        }
    }

    /// How many attempts to open a session failed since the last one that succeeded.
    pub fn failed_reconnects(&self) -> u32 {
        self.reconnect.lock().unwrap_or_else(|e| e.into_inner()).failed_attempts
    }
}

fn map_error(error: zk::Error, path: &str) -> Error {
    let path = path.to_string();
    match error {
        zk::Error::NoNode => Error::NoNode { path },
        zk::Error::NodeExists => Error::NodeExists { path },
        zk::Error::BadVersion => Error::BadVersion { path, expected: -1, actual: -1 },
        zk::Error::NotEmpty => Error::NotEmpty { path },
        zk::Error::NoChildrenForEphemerals => Error::NoChildrenForEphemerals { path },
        zk::Error::SessionExpired | zk::Error::ClientClosed => Error::SessionExpired,
        zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::NoHosts => Error::ConnectionLoss,
        other => Error::ZooKeeper(format!("{other} (at {path})")),
    }
}

fn stat(s: &zk::Stat) -> Stat {
    Stat {
        version: s.version,
        cversion: s.cversion,
        ephemeral_owner: s.ephemeral_owner,
        num_children: s.num_children,
        ctime_ms: s.ctime,
        mtime_ms: s.mtime,
    }
}

/// Turns a ZooKeeper one-shot watcher into a [`Watch`].
fn watch(watcher: zk::OneshotWatcher) -> Watch {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let event = watcher.changed().await;
        let event = match event.event_type {
            zk::EventType::NodeCreated => WatchEvent::Created,
            zk::EventType::NodeDeleted => WatchEvent::Deleted,
            zk::EventType::NodeDataChanged => WatchEvent::DataChanged,
            zk::EventType::NodeChildrenChanged => WatchEvent::ChildrenChanged,
            zk::EventType::Session => WatchEvent::SessionLost,
        };
        let _ = tx.send(event); // the watcher may have stopped caring
    });
    Watch::new(rx)
}

#[async_trait::async_trait]
impl MetadataStore for ZooKeeperStore {
    async fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<String> {
        crate::validate_path(path)?;
        let zk_mode = match mode {
            CreateMode::Persistent => zk::CreateMode::Persistent,
            CreateMode::Ephemeral => zk::CreateMode::Ephemeral,
            CreateMode::PersistentSequential => zk::CreateMode::PersistentSequential,
            CreateMode::EphemeralSequential => zk::CreateMode::EphemeralSequential,
        };
        let options = zk_mode.with_acls(zk::Acls::anyone_all());
        let client = self.client().await?;
        let (_, sequence) = client.create(path, data, &options).await.map_err(|e| map_error(e, path))?;
        Ok(if mode.is_sequential() { format!("{path}{sequence}") } else { path.to_string() })
    }

    async fn get(&self, path: &str) -> Result<Option<(Vec<u8>, Stat)>> {
        crate::validate_path(path)?;
        match self.client().await?.get_data(path).await {
            Ok((data, s)) => Ok(Some((data, stat(&s)))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(map_error(e, path)),
        }
    }

    async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        crate::validate_path(path)?;
        let s = self.client().await?.check_stat(path).await.map_err(|e| map_error(e, path))?;
        Ok(s.as_ref().map(stat))
    }

    async fn set(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<Stat> {
        crate::validate_path(path)?;
        let client = self.client().await?;
        match client.set_data(path, data, expected_version).await {
            Ok(s) => Ok(stat(&s)),
            Err(zk::Error::BadVersion) => {
                let actual = client.check_stat(path).await.ok().flatten().map_or(-1, |s| s.version);
                Err(Error::BadVersion { path: path.into(), expected: expected_version.unwrap_or(-1), actual })
            }
            Err(e) => Err(map_error(e, path)),
        }
    }

    async fn delete(&self, path: &str, expected_version: Option<i32>) -> Result<()> {
        crate::validate_path(path)?;
        self.client().await?.delete(path, expected_version).await.map_err(|e| map_error(e, path))
    }

    async fn children(&self, path: &str) -> Result<Vec<String>> {
        crate::validate_path(path)?;
        let mut children = self.client().await?.list_children(path).await.map_err(|e| map_error(e, path))?;
        children.sort();
        Ok(children)
    }

    async fn watch_data(&self, path: &str) -> Result<(Option<(Vec<u8>, Stat)>, Watch)> {
        crate::validate_path(path)?;
        let client = self.client().await?;
        loop {
            match client.get_and_watch_data(path).await {
                Ok((data, s, watcher)) => return Ok((Some((data, stat(&s))), watch(watcher))),
                Err(zk::Error::NoNode) => {}
                Err(e) => return Err(map_error(e, path)),
            }
            // Missing: watch for its creation instead. If it appeared in between,
            // read it again rather than report a stale absence.
            match client.check_and_watch_stat(path).await {
                Ok((None, watcher)) => return Ok((None, watch(watcher))),
                Ok((Some(_), _)) => continue,
                Err(e) => return Err(map_error(e, path)),
            }
        }
    }

    async fn watch_children(&self, path: &str) -> Result<(Vec<String>, Watch)> {
        crate::validate_path(path)?;
        let client = self.client().await?;
        let (mut children, watcher) = client.list_and_watch_children(path).await.map_err(|e| map_error(e, path))?;
        children.sort();
        Ok((children, watch(watcher)))
    }

    fn session_id(&self) -> i64 {
        self.client.try_read().map(|c| c.session_id().0).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_attempts_back_off_and_an_outage_is_logged_at_its_start_then_once_a_minute() {
        let start = Instant::now();
        let mut r = Reconnect::default();
        assert!(r.may_try(start));
        let mut now = start;
        let mut pauses = Vec::new();
        let mut logged = Vec::new();
        for _ in 0..7 {
            logged.push(r.failed(now));
            let next = r.next_attempt.unwrap();
            assert!(!r.may_try(next - Duration::from_millis(1)));
            assert!(r.may_try(next));
            pauses.push(next - now);
            now = next;
        }
        let ms: Vec<u128> = pauses.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 4000, 4000]);
        // 11.75 s of outage: logged at its start only.
        assert_eq!(logged, [true, false, false, false, false, false, false]);
        assert!(r.failed(start + Duration::from_secs(61)), "a minute later it is logged again");
        assert!(!r.failed(start + Duration::from_secs(62)));
        let (lasted, attempts) = r.succeeded(start + Duration::from_secs(70)).unwrap();
        assert_eq!((lasted, attempts), (Duration::from_secs(70), 9));
        assert!(r.may_try(start) && r.outage_since.is_none() && r.failed_attempts == 0);
        assert_eq!(r.succeeded(start), None, "no outage, nothing to report");
    }
}
