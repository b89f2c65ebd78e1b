//! [`LogDirs`]: the broker's log directories (`log.dirs`, JBOD), one [`LogManager`] each.
//!
//! Each directory is a complete log dir of its own, as in Kafka: its `.lock`, its
//! `meta.properties` (written by the broker), its checkpoint files and the
//! `<topic>-<partition>/` directories of the partitions it holds. A partition lives in
//! exactly one of them:
//! - at start, every directory is loaded and each partition is served from wherever its
//!   directory is; the same partition found in two directories stops the start
//!   ([`Error::PartitionInTwoDirs`]): nothing decides which copy is the right one, and
//!   silently picking one could serve (and replicate) the shorter;
//! - a new partition goes to the directory holding the fewest partitions ([`choose_dir`]);
//! - a directory that fails with an I/O error (at start, or when writing its
//!   checkpoints) goes offline with all its partitions ([`LogDirs::fail`]); the others
//!   keep serving. While one is offline, a partition found in no online directory is not
//!   created: its data may be in the failed one;
//! - a replica is moved to another directory only by [`LogDirs::move_replica`].
//!
//! With one directory this is exactly the single [`LogManager`] it wraps: same paths,
//! same files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use fjord_record::TopicPartition;

use crate::error::IoContext;
use crate::manager::Unhealthy;
use crate::partition_metadata::TopicId;
use crate::{lock, Error, Log, LogConfig, LogManager, Result};

/// The broker's log directories, in `log.dirs` order.
#[derive(Debug)]
pub struct LogDirs {
    dirs: Vec<LogDir>,
    /// Held while a new partition's directory is chosen and its log created, so two
    /// creations of one partition cannot land in two directories.
    placing: Mutex<()>,
    /// Partitions asked for ([`LogDirs::get_or_create`]) while a directory is offline and
    /// found in no online one: not created, as their data may be in the failed directory
    /// (Kafka refuses alike). Listed offline, with why.
    missing: Mutex<BTreeMap<TopicPartition, String>>,
    /// Partitions of directories that failed since the last [`LogDirs::take_failed`].
    failed: Mutex<Vec<TopicPartition>>,
    /// Held for the whole of a [`LogDirs::move_replica`]: moves run one at a time.
    moving: Mutex<()>,
    /// The move copying now, if any: its partition and `-future` directory.
    copying: Mutex<Option<(TopicPartition, PathBuf)>>,
    default_config: LogConfig,
}

#[derive(Debug)]
struct LogDir {
    path: PathBuf,
    state: RwLock<DirState>,
}

#[derive(Debug, Clone)]
enum DirState {
    Online(Arc<LogManager>),
    /// Failed with an I/O error, at start or later: nothing in it is served until the
    /// broker starts again with it repaired (or removed from `log.dirs`).
    Offline {
        /// The error.
        reason: String,
        /// The partitions it held when it failed (none known when it failed at start).
        partitions: Vec<TopicPartition>,
    },
}

/// One directory as DescribeLogDirs lists it.
#[derive(Debug, Clone)]
pub struct LogDirInfo {
    /// The directory, as configured.
    pub path: PathBuf,
    /// Its partitions' logs, or why the directory is offline.
    pub state: std::result::Result<Arc<LogManager>, String>,
}

impl LogDirs {
    /// Opens every directory of `dirs` (see [`LogManager::open`]) and checks that no
    /// partition is in two of them. `dirs` must not be empty nor name one directory twice.
    /// A directory that fails to open with an I/O error is offline (see [`LogDirs::fail`]),
    /// the others are served; when none opens, the first error is returned.
    pub fn open(dirs: Vec<PathBuf>, default_config: LogConfig) -> Result<LogDirs> {
        LogDirs::open_except(dirs, &BTreeMap::new(), default_config)
    }

    /// [`LogDirs::open`], with the directories of `failed` offline from the start (the
    /// broker could not read or write their `meta.properties`): why, per directory.
    pub fn open_except(dirs: Vec<PathBuf>, failed: &BTreeMap<PathBuf, String>, default_config: LogConfig) -> Result<LogDirs> {
        if dirs.is_empty() {
            return Err(Error::InvalidConfig { key: "log.dirs".into(), value: String::new(), reason: "no log directory" });
        }
        for (i, dir) in dirs.iter().enumerate() {
            if dirs[..i].contains(dir) {
                return Err(Error::InvalidConfig {
                    key: "log.dirs".into(),
                    value: dir.display().to_string(),
                    reason: "the same directory is listed twice",
                });
            }
        }
        let mut opened = Vec::with_capacity(dirs.len());
        let mut first_error = None;
        for path in dirs {
            let state = match failed.get(&path) {
                Some(reason) => DirState::Offline { reason: reason.clone(), partitions: Vec::new() },
                None => match LogManager::open(&path, default_config) {
                    Ok(manager) => DirState::Online(Arc::new(manager)),
                    Err(e @ Error::Io { .. }) => {
                        tracing::error!(
                            log_dir = %path.display(), error = %e,
                            "cannot open this log dir: it is offline, its partitions are not served; the other log dirs are"
                        );
                        let reason = e.to_string();
                        first_error.get_or_insert(e);
                        DirState::Offline { reason, partitions: Vec::new() }
                    }
                    Err(e) => return Err(e),
                },
            };
            opened.push(LogDir { path, state: RwLock::new(state) });
        }
        let logs = LogDirs {
            dirs: opened,
            placing: Mutex::new(()),
            missing: Mutex::new(BTreeMap::new()),
            failed: Mutex::new(Vec::new()),
            moving: Mutex::new(()),
            copying: Mutex::new(None),
            default_config,
        };
        if logs.online().is_empty() {
            return Err(first_error
                .unwrap_or_else(|| Error::LogDirOffline { partition: "any".into(), reason: "every log dir is offline".into() }));
        }
        let mut seen: BTreeMap<TopicPartition, PathBuf> = BTreeMap::new();
        for manager in logs.online() {
            for tp in manager.partitions().into_iter().chain(manager.offline_partitions()) {
                if let Some(first) = seen.get(&tp) {
                    return Err(Error::PartitionInTwoDirs {
                        partition: tp.to_string(),
                        first: first.join(tp.dir_name()),
                        second: manager.dir().join(tp.dir_name()),
                    });
                }
                seen.insert(tp, manager.dir().to_path_buf());
            }
        }
        Ok(logs)
    }

    /// Every directory, in `log.dirs` order.
    pub fn dirs(&self) -> Vec<LogDirInfo> {
        self.dirs
            .iter()
            .map(|d| LogDirInfo {
                path: d.path.clone(),
                state: match &*lock::read(&d.state) {
                    DirState::Online(m) => Ok(m.clone()),
                    DirState::Offline { reason, .. } => Err(reason.clone()),
                },
            })
            .collect()
    }

    /// The online directories' managers, in `log.dirs` order.
    fn online(&self) -> Vec<Arc<LogManager>> {
        self.dirs
            .iter()
            .filter_map(|d| match &*lock::read(&d.state) {
                DirState::Online(m) => Some(m.clone()),
                DirState::Offline { .. } => None,
            })
            .collect()
    }

    /// The offline directories: (path, why, partitions it held).
    fn offline(&self) -> Vec<(PathBuf, String, Vec<TopicPartition>)> {
        self.dirs
            .iter()
            .filter_map(|d| match &*lock::read(&d.state) {
                DirState::Online(_) => None,
                DirState::Offline { reason, partitions } => Some((d.path.clone(), reason.clone(), partitions.clone())),
            })
            .collect()
    }

    /// Takes the directory `dir` offline after an I/O error (`reason`), as Kafka does with
    /// a failed log dir: none of its partitions is served from now (they are listed
    /// [`Unhealthy::Offline`]), the other directories go on. Its files are left as they
    /// are. Returns the partitions it held (empty when it was not online).
    pub fn fail(&self, dir: &Path, reason: String) -> Vec<TopicPartition> {
        let Some(entry) = self.dirs.iter().find(|d| d.path == dir) else { return Vec::new() };
        let mut state = lock::write(&entry.state);
        let DirState::Online(manager) = &*state else { return Vec::new() };
        let mut partitions = manager.partitions();
        partitions.extend(manager.offline_partitions());
        tracing::error!(
            log_dir = %dir.display(), error = %reason, partitions = partitions.len(),
            "log dir failed: it is offline, its partitions are not served; the other log dirs are"
        );
        *state = DirState::Offline { reason, partitions: partitions.clone() };
        lock::mutex(&self.failed).extend(partitions.iter().cloned());
        partitions
    }

    /// The partitions of the directories that failed since the last call: for the broker
    /// to stop serving them (their logs stay open in its replicas until it does).
    pub fn take_failed(&self) -> Vec<TopicPartition> {
        std::mem::take(&mut *lock::mutex(&self.failed))
    }

    /// The first directory (the one `log.dir`/`--data-dir` names, and the only one with
    /// a single directory).
    pub fn first_dir(&self) -> &Path {
        &self.dirs[0].path
    }

    /// The directory holding the partition (its log open, or listed offline there).
    pub fn dir_of(&self, tp: &TopicPartition) -> Option<PathBuf> {
        if let Some(owner) = self.owner(tp) {
            return Some(owner.dir().to_path_buf());
        }
        self.offline().into_iter().find(|(_, _, partitions)| partitions.contains(tp)).map(|(path, _, _)| path)
    }

    /// The online manager holding the partition (open or offline there).
    fn owner(&self, tp: &TopicPartition) -> Option<Arc<LogManager>> {
        let online = self.online();
        let held = online.iter().position(|m| m.get(tp).is_some()).or_else(|| online.iter().position(|m| m.is_offline(tp)));
        held.map(|i| online[i].clone())
    }

    /// The partition's log, if an online directory holds it open.
    pub fn get(&self, tp: &TopicPartition) -> Option<Arc<Log>> {
        self.online().iter().find_map(|m| m.get(tp))
    }

    /// The partition's log, created with `config` when missing (in the directory
    /// [`choose_dir`] picks); an existing log gets `config` applied. See
    /// [`LogManager::get_or_create`]. While a directory is offline, a partition found in
    /// no online directory is not created ([`Error::LogDirOffline`]): its data may be in
    /// the failed one, and an empty replica served in its place could lose it.
    pub fn get_or_create(&self, tp: &TopicPartition, config: LogConfig) -> Result<Arc<Log>> {
        if let Some(owner) = self.owner(tp) {
            return owner.get_or_create(tp, config);
        }
        let _placing = lock::mutex(&self.placing);
        // Created by another thread while this one waited.
        if let Some(owner) = self.owner(tp) {
            return owner.get_or_create(tp, config);
        }
        let offline = self.offline();
        if let Some((path, reason, _)) = offline.iter().find(|(_, _, partitions)| partitions.contains(tp)).or(offline.first()) {
            let reason = format!("log dir {} is offline ({reason}) and may hold it", path.display());
            lock::mutex(&self.missing).insert(tp.clone(), reason.clone());
            return Err(Error::LogDirOffline { partition: tp.to_string(), reason });
        }
        let online = self.online();
        let loads: Vec<usize> = online.iter().map(|m| m.partitions().len() + m.offline_partitions().len()).collect();
        let chosen = &online[choose_dir(&loads).expect("invariant: at least one log dir is online")];
        let log = chosen.get_or_create(tp, config)?;
        if self.dirs.len() > 1 {
            tracing::info!(partition = %tp, log_dir = %chosen.dir().display(), "new partition placed in the log dir with the fewest partitions");
        }
        Ok(log)
    }

    /// The topic id in the partition's `partition.metadata`, from the directory holding
    /// it; `Ok(None)` when no online directory holds one.
    pub fn topic_id(&self, tp: &TopicPartition) -> Result<Option<TopicId>> {
        if let Some(owner) = self.owner(tp) {
            return owner.topic_id(tp);
        }
        for manager in self.online() {
            if let Some(id) = manager.topic_id(tp)? {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// See [`LogManager::write_topic_id`].
    pub fn write_topic_id(&self, tp: &TopicPartition, id: &TopicId) -> Result<()> {
        match self.owner(tp) {
            Some(owner) => owner.write_topic_id(tp, id),
            None => Err(Error::LogDirOffline { partition: tp.to_string(), reason: "no online log dir holds it".into() }),
        }
    }

    /// See [`LogManager::take_offline`] (in the directory holding it; the first online
    /// one when none does).
    pub fn take_offline(&self, tp: &TopicPartition, reason: String) {
        if let Some(manager) = self.owner(tp).or_else(|| self.online().into_iter().next()) {
            manager.take_offline(tp, reason);
        }
    }

    /// Whether the partition is not served here because its log could not be opened (see
    /// [`LogManager::is_offline`]) or its directory is offline.
    pub fn is_offline(&self, tp: &TopicPartition) -> bool {
        self.online().iter().any(|m| m.is_offline(tp))
            || self.offline().iter().any(|(_, _, partitions)| partitions.contains(tp))
            || lock::mutex(&self.missing).contains_key(tp)
    }

    /// The partitions [`LogDirs::is_offline`] says are, sorted.
    pub fn offline_partitions(&self) -> Vec<TopicPartition> {
        let mut all: Vec<_> = self.online().iter().flat_map(|m| m.offline_partitions()).collect();
        all.extend(self.offline().into_iter().flat_map(|(_, _, partitions)| partitions));
        all.extend(lock::mutex(&self.missing).keys().cloned());
        all.sort();
        all.dedup();
        all
    }

    /// The partitions that are offline or damaged (see [`LogManager::unhealthy`]), the
    /// offline directories' partitions included. Cheap: one map is shared, not copied,
    /// when only one directory has any.
    pub fn unhealthy(&self) -> Arc<BTreeMap<TopicPartition, Unhealthy>> {
        let mut maps: Vec<Arc<BTreeMap<TopicPartition, Unhealthy>>> =
            self.online().iter().map(|m| m.unhealthy()).filter(|h| !h.is_empty()).collect();
        let offline = self.offline();
        let missing = lock::mutex(&self.missing).clone();
        if offline.iter().all(|(_, _, partitions)| partitions.is_empty()) && missing.is_empty() && maps.len() <= 1 {
            return maps.pop().unwrap_or_default();
        }
        let mut all: BTreeMap<TopicPartition, Unhealthy> =
            maps.iter().flat_map(|h| h.iter().map(|(tp, u)| (tp.clone(), u.clone()))).collect();
        for (path, reason, partitions) in offline {
            for tp in partitions {
                let reason = format!("log dir {} is offline: {reason}", path.display());
                all.insert(tp, Unhealthy::Offline { reason });
            }
        }
        for (tp, reason) in missing {
            all.entry(tp).or_insert(Unhealthy::Offline { reason });
        }
        Arc::new(all)
    }

    /// See [`LogManager::refresh_health`], for every online directory.
    pub fn refresh_health(&self) {
        for manager in self.online() {
            manager.refresh_health();
        }
    }

    /// The default config partitions were opened with.
    pub fn default_config(&self) -> LogConfig {
        self.default_config
    }

    /// Every partition with an open log, sorted.
    pub fn partitions(&self) -> Vec<TopicPartition> {
        let mut all: Vec<_> = self.online().iter().flat_map(|m| m.partitions()).collect();
        all.sort();
        all
    }

    /// Deletes the partition's log and directory (no-op when absent).
    pub fn delete(&self, tp: &TopicPartition) -> Result<()> {
        lock::mutex(&self.missing).remove(tp);
        match self.owner(tp) {
            Some(owner) => owner.delete(tp),
            None => Ok(()),
        }
    }

    /// See [`LogManager::move_aside`] (in the directory holding it). A partition of an
    /// offline directory is left where it is (`Ok(None)`).
    pub fn move_aside(&self, tp: &TopicPartition, now_ms: u64) -> Result<Option<PathBuf>> {
        lock::mutex(&self.missing).remove(tp);
        match self.owner(tp) {
            Some(owner) => owner.move_aside(tp, now_ms),
            None => Ok(None),
        }
    }

    /// Writes every online directory's checkpoint files. Every directory is attempted;
    /// a directory failing with an I/O error is taken offline ([`LogDirs::fail`]); the
    /// first error is returned.
    pub fn checkpoint(&self) -> Result<()> {
        self.each(LogManager::checkpoint)
    }

    /// See [`LogManager::flush_due`], for every online directory (failures as for
    /// [`LogDirs::checkpoint`]).
    pub fn flush_due(&self, now_ms: i64) -> Result<()> {
        self.each(|m| m.flush_due(now_ms))
    }

    /// See [`LogManager::apply_retention`], for every online directory; the segments deleted.
    pub fn apply_retention(&self, now_ms: i64) -> Result<usize> {
        let mut deleted = 0;
        self.each(|m| {
            deleted += m.apply_retention(now_ms)?;
            Ok(())
        })?;
        Ok(deleted)
    }

    /// See [`LogManager::scrub`]: each online directory (a disk of its own) checks its
    /// share of `budget`. Returns the bytes checked.
    pub fn scrub(&self, budget: u64) -> u64 {
        let online = self.online();
        let share = budget / online.len().max(1) as u64;
        online.iter().map(|m| m.scrub(share.max(1))).sum()
    }

    /// Flushes, closes and checkpoints every online directory (see [`LogManager::close`]).
    pub fn close(&self) -> Result<()> {
        let mut first = None;
        for manager in self.online() {
            if let Err(e) = manager.close() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Runs `f` on every online directory, then returns the first error. A directory
    /// whose `f` fails with an I/O error other than a full disk is taken offline: a full
    /// disk is not a failed one (writes resume once space is freed).
    fn each(&self, mut f: impl FnMut(&LogManager) -> Result<()>) -> Result<()> {
        let mut first = None;
        for manager in self.online() {
            if let Err(e) = f(&manager) {
                if self.dirs.len() > 1 && dir_failure(&e) {
                    self.fail(manager.dir(), e.to_string());
                }
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// The suffix of a partition directory being copied into another log dir by
/// [`LogDirs::move_replica`] (`<topic>-<partition>-future`, never loaded as a partition).
pub const FUTURE_SUFFIX: &str = "-future";

/// (length, modification time) of each file copied, to find the ones changed since.
type Copied = BTreeMap<std::ffi::OsString, (u64, Option<std::time::SystemTime>)>;

/// The copy a replica move is writing (DescribeLogDirs lists it as a future replica).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FutureReplica {
    /// The partition moving.
    pub partition: TopicPartition,
    /// The log dir it moves into, as configured.
    pub log_dir: PathBuf,
    /// Bytes copied so far.
    pub size_bytes: u64,
}

/// Unregisters the move copying now when a [`LogDirs::move_replica`] returns.
struct Copying<'a>(&'a Mutex<Option<(TopicPartition, PathBuf)>>);

impl Drop for Copying<'_> {
    fn drop(&mut self) {
        *lock::mutex(self.0) = None;
    }
}

impl LogDirs {
    /// The copy the replica move in progress is writing, until its rename into place.
    pub fn future_replica(&self) -> Option<FutureReplica> {
        let (partition, future) = lock::mutex(&self.copying).clone()?;
        let log_dir = self.dirs.iter().find(|d| Some(d.path.as_path()) == future.parent())?.path.clone();
        // Gone once renamed into place: no longer a future replica.
        let entries = std::fs::read_dir(&future).ok()?;
        let size_bytes = entries.filter_map(|e| e.ok()?.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum();
        Some(FutureReplica { partition, log_dir, size_bytes })
    }

    /// Moves the partition's replica into the log dir `to` (AlterReplicaLogDirs), blocking
    /// until done. Returns the log now serving it (the moved one; on a failure after the
    /// pause began, the original reopened where it was, and the error).
    ///
    /// `cancelled` is asked before each file of the copy made while the partition serves:
    /// once it says yes (the broker stops), the copy is deleted and the move ends with
    /// [`Error::MoveCancelled`], the source untouched and serving. Past that copy the
    /// move completes (the pause is short).
    ///
    /// The scheme (simpler than Kafka's future replica that catches up by fetching):
    /// 1. while the partition serves, its sealed segments are copied into
    ///    `<to>/<topic>-<partition>-future/` (never loaded as a partition);
    /// 2. then the partition pauses: its log is detached and closed (appends in between
    ///    fail, NOT_LEADER_OR_FOLLOWER for clients, who retry), the files that changed or
    ///    appeared since the copy (the active segment, snapshots, checkpoints, a compacted
    ///    segment) are copied, every file and the directory fsynced;
    /// 3. the copy is renamed to `<to>/<topic>-<partition>` (the commit point) and opened
    ///    with the log's place (recovery point, high watermark, log start);
    /// 4. only then is the source directory deleted.
    ///
    /// A crash before 3 leaves the source as it was (the `-future` copy is ignored); a
    /// crash between 3 and 4 leaves the partition in two log dirs, which stops the next
    /// start ([`Error::PartitionInTwoDirs`], as Kafka does) rather than pick one.
    pub fn move_replica(
        &self,
        tp: &TopicPartition,
        to: &Path,
        cancelled: &dyn Fn() -> bool,
    ) -> std::result::Result<Arc<Log>, (Error, Option<Arc<Log>>)> {
        let _moving = lock::mutex(&self.moving);
        let fail = |e: Error| (e, self.get(tp));
        if cancelled() {
            return Err(fail(Error::MoveCancelled { partition: tp.to_string() }));
        }
        let source = self.owner(tp).ok_or_else(|| {
            fail(Error::LogDirOffline { partition: tp.to_string(), reason: "no online log dir holds it".into() })
        })?;
        let dest = self.online().into_iter().find(|m| m.dir() == to).ok_or_else(|| {
            fail(Error::LogDirOffline { partition: tp.to_string(), reason: format!("log dir {} is not online", to.display()) })
        })?;
        let log = source
            .get(tp)
            .ok_or_else(|| fail(Error::LogDirOffline { partition: tp.to_string(), reason: "its log is not open".into() }))?;
        if Arc::ptr_eq(&source, &dest) {
            return Ok(log);
        }
        let from = log.dir().to_path_buf();
        let future = dest.dir().join(format!("{}{FUTURE_SUFFIX}", tp.dir_name()));
        let target = dest.dir().join(tp.dir_name());
        if target.exists() {
            return Err(fail(Error::PartitionInTwoDirs { partition: tp.to_string(), first: from, second: target }));
        }
        // An earlier move's partial copy: the source is the one served.
        if future.exists() {
            std::fs::remove_dir_all(&future).at(&future).map_err(fail)?;
        }
        std::fs::create_dir_all(&future).at(&future).map_err(fail)?;
        *lock::mutex(&self.copying) = Some((tp.clone(), future.clone()));
        let _copying = Copying(&self.copying);
        let mut copied = Copied::new();
        let sealed = copy_changed(&from, &future, &mut copied, true, &|| {
            cancelled().then(|| Error::MoveCancelled { partition: tp.to_string() })
        });
        if let Err(e) = sealed {
            let _ = std::fs::remove_dir_all(&future);
            return Err(fail(e));
        }
        // The pause: from here the partition takes no appends until it opens again.
        let config = log.config();
        source.detach(tp);
        let closed = log.close();
        let place = (
            log.recovery_point(),
            Some(log.high_watermark()),
            Some((log.log_start_offset(), crate::checkpoint::Format::Checksummed)),
        );
        let committed = closed
            .and_then(|()| copy_changed(&from, &future, &mut copied, false, &|| None))
            .and_then(|()| crate::checkpoint::sync_dir(&future))
            .and_then(|()| std::fs::rename(&future, &target).at(&target))
            .and_then(|()| crate::checkpoint::sync_dir(dest.dir()));
        if let Err(e) = committed {
            tracing::error!(partition = %tp, to = %to.display(), error = %e, "moving the replica failed; it stays where it was");
            let _ = std::fs::remove_dir_all(&future);
            let reopened = source.open_moved(tp, config, place).ok();
            return Err((e, reopened));
        }
        let moved = match dest.open_moved(tp, config, place) {
            Ok(moved) => moved,
            Err(e) => {
                // The copy is in place (and, on disk, the source too: both are kept, and the
                // next start refuses the duplicate rather than pick one).
                tracing::error!(partition = %tp, to = %to.display(), error = %e, "the moved replica does not open; both copies are kept");
                return Err((e, None));
            }
        };
        if let Err(e) = std::fs::remove_dir_all(&from).at(&from).and_then(|()| crate::checkpoint::sync_dir(source.dir())) {
            tracing::error!(partition = %tp, from = %from.display(), error = %e, "deleting the moved replica's old directory failed: remove it before the next start");
        }
        for manager in [&source, &dest] {
            if let Err(e) = manager.checkpoint() {
                tracing::warn!(log_dir = %manager.dir().display(), error = %e, "checkpoint after a replica move failed");
            }
        }
        tracing::info!(partition = %tp, from = %from.display(), to = %target.display(), "replica moved to another log dir");
        Ok(moved)
    }
}

/// Copies the files of `from` into `to` that are not in `copied` or changed since (and
/// deletes from `to` those no longer in `from`), each fsynced. With `sealed_only`, only
/// the segments below the last one (the active segment is still written). Before each
/// file, `stop` may end the copy with its error.
fn copy_changed(from: &Path, to: &Path, copied: &mut Copied, sealed_only: bool, stop: &dyn Fn() -> Option<Error>) -> Result<()> {
    let mut names: Vec<(std::ffi::OsString, std::fs::Metadata)> = Vec::new();
    for entry in std::fs::read_dir(from).at(from)? {
        let entry = entry.at(from)?;
        let metadata = entry.metadata().at(entry.path())?;
        if metadata.is_file() {
            names.push((entry.file_name(), metadata));
        }
    }
    let base = |name: &std::ffi::OsString| -> Option<u64> { name.to_str()?.split('.').next()?.parse().ok() };
    let active = names.iter().filter(|(n, _)| n.to_str().is_some_and(|n| n.ends_with(".log"))).filter_map(|(n, _)| base(n)).max();
    for (name, metadata) in &names {
        if sealed_only {
            let sealed =
                name.to_str().is_some_and(|n| [".log", ".index", ".timeindex", ".txnindex"].iter().any(|ext| n.ends_with(ext)))
                    && base(name).zip(active).is_some_and(|(b, a)| b < a);
            if !sealed {
                continue;
            }
        }
        let stamp = (metadata.len(), metadata.modified().ok());
        if copied.get(name) == Some(&stamp) {
            continue;
        }
        if let Some(e) = stop() {
            return Err(e);
        }
        let (src, dst) = (from.join(name), to.join(name));
        std::fs::copy(&src, &dst).at(&src)?;
        std::fs::File::open(&dst).and_then(|f| f.sync_all()).at(&dst)?;
        copied.insert(name.clone(), stamp);
    }
    if !sealed_only {
        let present: std::collections::BTreeSet<_> = names.iter().map(|(n, _)| n.clone()).collect();
        for gone in copied.keys().filter(|n| !present.contains(*n)).cloned().collect::<Vec<_>>() {
            let path = to.join(&gone);
            std::fs::remove_file(&path).at(&path)?;
            copied.remove(&gone);
        }
    }
    Ok(())
}

/// Whether `error` means the directory failed (an I/O error that is not a full disk).
fn dir_failure(error: &Error) -> bool {
    match error {
        Error::Io { source, .. } => !matches!(source.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded),
        _ => false,
    }
}

/// Which directory gets a new partition, given how many partitions each holds: the one
/// with the fewest, the first in `log.dirs` order on a tie (Kafka's rule). `None` when
/// there is no directory.
///
/// Fewest partitions rather than fewest bytes: a new partition is empty, so by bytes
/// every partition created in a burst would go to the one emptiest disk, and the
/// partitions' future sizes are unknown anyway. Example: loads `[3, 1, 1]` → `Some(1)`.
pub fn choose_dir(partitions: &[usize]) -> Option<usize> {
    partitions.iter().enumerate().min_by_key(|&(i, &n)| (n, i)).map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{batch, config};

    #[test]
    fn the_directory_with_the_fewest_partitions_is_chosen_the_first_on_a_tie() {
        assert_eq!(choose_dir(&[]), None);
        assert_eq!(choose_dir(&[7]), Some(0));
        assert_eq!(choose_dir(&[0, 0, 0]), Some(0));
        assert_eq!(choose_dir(&[3, 1, 1]), Some(1));
        assert_eq!(choose_dir(&[2, 2, 1]), Some(2));
        assert_eq!(choose_dir(&[1, 5, 0, 0]), Some(2));
    }

    #[test]
    fn new_partitions_spread_over_the_directories_and_load_from_where_they_are() {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = ["a", "b", "c"].iter().map(|d| root.path().join(d)).collect();
        let tps: Vec<TopicPartition> = (0..6).map(|p| TopicPartition::new("t", p)).collect();
        {
            let logs = LogDirs::open(dirs.clone(), config()).unwrap();
            for tp in &tps {
                logs.get_or_create(tp, config()).unwrap().append(&mut batch(3), 0).unwrap();
            }
            for (i, dir) in dirs.iter().enumerate() {
                let held: Vec<_> = tps.iter().filter(|tp| dir.join(tp.dir_name()).is_dir()).collect();
                assert_eq!(held, vec![&tps[i], &tps[i + 3]], "round by round, fewest first: {}", dir.display());
            }
            assert_eq!(logs.dir_of(&tps[4]), Some(dirs[1].clone()));
            logs.close().unwrap();
            for dir in &dirs {
                assert!(dir.join(crate::RECOVERY_POINT_CHECKPOINT).is_file(), "each dir has its own checkpoints");
            }
        }
        // The directory listing is reordered: each partition still loads from where it is.
        let reordered = vec![dirs[2].clone(), dirs[0].clone(), dirs[1].clone()];
        let logs = LogDirs::open(reordered, config()).unwrap();
        assert_eq!(logs.partitions(), tps);
        for tp in &tps {
            assert_eq!(logs.get(tp).unwrap().log_end_offset(), 3, "{tp}");
        }
        assert_eq!(logs.dir_of(&tps[4]), Some(dirs[1].clone()));
        // The next new one goes to the first listed of the least loaded (all hold two).
        let new = TopicPartition::new("u", 0);
        logs.get_or_create(&new, config()).unwrap();
        assert_eq!(logs.dir_of(&new), Some(dirs[2].clone()));
        logs.delete(&tps[0]).unwrap();
        assert!(!dirs[0].join("t-0").exists());
        assert!(logs.get(&tps[0]).is_none());
    }

    #[test]
    fn a_partition_in_two_directories_stops_the_start_and_nothing_is_touched() {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = ["a", "b"].iter().map(|d| root.path().join(d)).collect();
        let tp = TopicPartition::new("t", 0);
        for dir in &dirs {
            let m = LogManager::open(dir, config()).unwrap();
            m.get_or_create(&tp, config()).unwrap().append(&mut batch(2), 0).unwrap();
            m.close().unwrap();
        }
        let err = LogDirs::open(dirs.clone(), config()).unwrap_err();
        let Error::PartitionInTwoDirs { partition, first, second } = &err else { panic!("{err}") };
        assert_eq!((partition.as_str(), first, second), ("t-0", &dirs[0].join("t-0"), &dirs[1].join("t-0")));
        assert!(err.to_string().contains("t-0"), "{err}");
        for dir in &dirs {
            assert!(dir.join("t-0").join("00000000000000000000.log").is_file(), "both copies kept");
        }
        // A directory listed twice is refused too.
        assert!(matches!(LogDirs::open(vec![dirs[0].clone(), dirs[0].clone()], config()), Err(Error::InvalidConfig { .. })));
    }

    #[test]
    fn a_directory_that_cannot_be_opened_is_offline_and_the_others_serve() {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = ["a", "b"].iter().map(|d| root.path().join(d)).collect();
        let (in_a, elsewhere) = (TopicPartition::new("t", 0), TopicPartition::new("t", 1));
        {
            let logs = LogDirs::open(dirs.clone(), config()).unwrap();
            for tp in [&in_a, &elsewhere] {
                logs.get_or_create(tp, config()).unwrap().append(&mut batch(2), 0).unwrap();
            }
            assert_eq!(logs.dir_of(&elsewhere), Some(dirs[1].clone()));
            logs.close().unwrap();
        }
        // b's disk is gone: a file where the directory was.
        std::fs::rename(&dirs[1], root.path().join("b.aside")).unwrap();
        std::fs::write(&dirs[1], "not a directory").unwrap();
        let logs = LogDirs::open(dirs.clone(), config()).unwrap();
        assert_eq!(logs.get(&in_a).unwrap().log_end_offset(), 2, "a is served");
        let described = logs.dirs();
        assert!(described[0].state.is_ok() && described[1].state.is_err(), "{described:?}");
        // What b held is unknown: not created elsewhere while b is offline, and listed offline.
        let err = logs.get_or_create(&elsewhere, config()).unwrap_err();
        assert!(matches!(&err, Error::LogDirOffline { .. }), "{err}");
        assert!(err.to_string().contains(&dirs[1].display().to_string()), "{err}");
        assert!(logs.is_offline(&elsewhere));
        assert!(matches!(logs.unhealthy().get(&elsewhere), Some(Unhealthy::Offline { .. })));
        assert!(!root.path().join("a").join("t-1").exists(), "no empty copy made in a");
        logs.close().unwrap();
        // Every directory offline: the start fails.
        std::fs::rename(&dirs[0], root.path().join("a.aside")).unwrap();
        std::fs::write(&dirs[0], "not a directory").unwrap();
        assert!(matches!(LogDirs::open(dirs.clone(), config()), Err(Error::Io { .. })));
    }

    #[test]
    fn a_directory_failing_its_checkpoint_goes_offline_with_its_partitions_only() {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = ["a", "b"].iter().map(|d| root.path().join(d)).collect();
        let logs = LogDirs::open(dirs.clone(), config()).unwrap();
        let (in_a, in_b) = (TopicPartition::new("t", 0), TopicPartition::new("t", 1));
        for tp in [&in_a, &in_b] {
            logs.get_or_create(tp, config()).unwrap().append(&mut batch(2), 0).unwrap();
        }
        assert_eq!(logs.dir_of(&in_b), Some(dirs[1].clone()));
        // b's checkpoint cannot be written: a directory where the file goes.
        let checkpoint = dirs[1].join(crate::RECOVERY_POINT_CHECKPOINT);
        std::fs::remove_file(&checkpoint).ok();
        std::fs::create_dir(&checkpoint).unwrap();
        std::fs::write(checkpoint.join("x"), "x").unwrap();
        assert!(logs.checkpoint().is_err(), "the failure is reported");
        assert!(logs.get(&in_b).is_none(), "b's partition is no longer served");
        assert!(logs.get(&in_a).is_some(), "a's still is");
        let unhealthy = logs.unhealthy();
        let Some(Unhealthy::Offline { reason }) = unhealthy.get(&in_b) else { panic!("{unhealthy:?}") };
        assert!(reason.contains("is offline"), "{reason}");
        assert!(!unhealthy.contains_key(&in_a));
        assert_eq!(logs.offline_partitions(), vec![in_b.clone()]);
        assert!(matches!(logs.get_or_create(&in_b, config()), Err(Error::LogDirOffline { .. })));
        logs.checkpoint().unwrap();
        logs.close().unwrap();
        assert!(dirs[1].join("t-1").join("00000000000000000000.log").is_file(), "nothing deleted");
    }

    #[test]
    fn a_replica_moves_to_another_directory_with_every_record_and_its_place() {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = ["a", "b"].iter().map(|d| root.path().join(d)).collect();
        let tp = TopicPartition::new("t", 0);
        {
            let logs = LogDirs::open(dirs.clone(), config()).unwrap();
            let log = logs.get_or_create(&tp, config()).unwrap();
            for _ in 0..20 {
                log.append(&mut batch(3), 0).unwrap();
            }
            log.set_high_watermark(45);
            log.delete_records_before(4).unwrap();
            assert!(log.segment_count() > 3, "sealed segments are copied first");
            assert_eq!(logs.dir_of(&tp), Some(dirs[0].clone()));
            // A partial copy left by an interrupted move is replaced.
            std::fs::create_dir_all(dirs[1].join("t-0-future")).unwrap();
            std::fs::write(dirs[1].join("t-0-future").join("junk"), "x").unwrap();
            let moved = logs.move_replica(&tp, &dirs[1], &|| false).map_err(|(e, _)| e).unwrap();
            assert!(matches!(log.append(&mut batch(1), 0), Err(Error::Closed { .. })), "the old log takes no appends");
            assert_eq!(logs.dir_of(&tp), Some(dirs[1].clone()));
            assert!(!dirs[0].join("t-0").exists(), "the source is deleted once the copy is in place");
            assert!(!dirs[1].join("t-0-future").exists());
            assert!(!dirs[1].join("t-0").join("junk").exists());
            assert_eq!((moved.log_start_offset(), moved.log_end_offset(), moved.high_watermark()), (4, 60, 45));
            moved.append(&mut batch(2), 0).unwrap();
            assert!(std::ptr::eq(logs.get(&tp).unwrap().as_ref(), moved.as_ref()));
            // Moving to where it is changes nothing; to an unknown directory is refused.
            assert!(Arc::ptr_eq(&logs.move_replica(&tp, &dirs[1], &|| false).map_err(|(e, _)| e).unwrap(), &moved));
            assert!(logs.move_replica(&tp, &root.path().join("nope"), &|| false).is_err());
            drop(moved);
            drop(logs); // a crash: no close
        }
        let logs = LogDirs::open(dirs.clone(), config()).unwrap();
        let log = logs.get(&tp).unwrap();
        assert_eq!(logs.dir_of(&tp), Some(dirs[1].clone()));
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (4, 62));
        // Every batch reads back, from the log start to the end.
        let mut at = 4;
        while at < 62 {
            let read = log.read(at, 1 << 20, None, true).unwrap();
            assert!(read.len > 0 && read.next_offset > at, "{at}");
            at = read.next_offset;
        }
        assert_eq!(at, 62);
    }

    #[test]
    fn a_cancelled_move_deletes_its_copy_and_leaves_the_source_serving() {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = ["a", "b"].iter().map(|d| root.path().join(d)).collect();
        let tp = TopicPartition::new("t", 0);
        let logs = LogDirs::open(dirs.clone(), config()).unwrap();
        let log = logs.get_or_create(&tp, config()).unwrap();
        for _ in 0..20 {
            log.append(&mut batch(3), 0).unwrap();
        }
        assert!(log.segment_count() > 3, "several sealed segments: the copy takes several files");
        assert_eq!(logs.future_replica(), None, "no move, no future replica");
        // The broker stops once the copy has begun: asked before each file, the third time.
        let asked = std::cell::Cell::new(0);
        let seen = std::cell::RefCell::new(None);
        let cancelled = || {
            asked.set(asked.get() + 1);
            if asked.get() == 3 {
                *seen.borrow_mut() = logs.future_replica();
            }
            asked.get() >= 3
        };
        let (err, serving) = logs.move_replica(&tp, &dirs[1], &cancelled).unwrap_err();
        assert!(matches!(err, Error::MoveCancelled { .. }), "{err}");
        // While it copied, the copy was the partition's future replica in b.
        let future = seen.into_inner().expect("a future replica while copying");
        assert_eq!((&future.partition, &future.log_dir), (&tp, &dirs[1]));
        assert!(future.size_bytes > 0, "{future:?}");
        // The source is untouched and still the one served; the copy is gone.
        assert!(Arc::ptr_eq(&serving.unwrap(), &log));
        assert_eq!(logs.dir_of(&tp), Some(dirs[0].clone()));
        assert!(!dirs[1].join("t-0-future").exists() && !dirs[1].join("t-0").exists());
        assert_eq!(logs.future_replica(), None);
        log.append(&mut batch(1), 0).unwrap();
        assert_eq!(log.log_end_offset(), 61);
        // A move asked to stop before it starts copies nothing.
        assert!(matches!(logs.move_replica(&tp, &dirs[1], &|| true), Err((Error::MoveCancelled { .. }, Some(_)))));
        assert!(!dirs[1].join("t-0-future").exists());
    }

    #[test]
    fn one_directory_is_the_plain_log_manager() {
        let root = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        {
            let logs = LogDirs::open(vec![root.path().to_path_buf()], config()).unwrap();
            logs.get_or_create(&tp, config()).unwrap().append(&mut batch(2), 0).unwrap();
            logs.close().unwrap();
        }
        assert!(root.path().join("t-0").is_dir());
        let m = LogManager::open(root.path(), config()).unwrap();
        assert_eq!(m.get(&tp).unwrap().log_end_offset(), 2);
    }
}
