//! [`LogManager`]: the partitions of one log dir (`log.dirs`) and its checkpoints.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use fjord_record::{Offset, TopicPartition};

use crate::checkpoint::{self, Format};
use crate::error::IoContext;
use crate::log_start::{self, Decision};
use crate::partition_metadata::{self, TopicId};
use crate::{lock, Error, Log, LogConfig, Result};

/// Per partition: everything below is fsynced.
pub const RECOVERY_POINT_CHECKPOINT: &str = "recovery-point-offset-checkpoint";
/// Per partition: the high watermark.
pub const REPLICATION_CHECKPOINT: &str = "replication-offset-checkpoint";
/// Log start offsets moved by [`Log::delete_records_before`] (Kafka's file name): a
/// start inside a segment is not visible in the segment files.
pub const LOG_START_CHECKPOINT: &str = "log-start-offset-checkpoint";
/// Between a partition directory's name and the time it was moved aside: see
/// [`LogManager::move_aside`].
pub const ORPHAN_MARKER: &str = "-orphan-";
/// The file a [`LogManager`] holds an exclusive lock on for as long as it is open (Kafka's
/// name), so a second broker or an offline tool (`fjord logs repair`) cannot write the
/// same log dir behind it.
pub const LOCK_FILE: &str = ".lock";
/// Files the log dir may hold besides partition directories.
const KNOWN_FILES: &[&str] =
    &[RECOVERY_POINT_CHECKPOINT, REPLICATION_CHECKPOINT, LOG_START_CHECKPOINT, "meta.properties", LOCK_FILE];

/// Many partitions under one log dir, with the dir-level checkpoint files.
#[derive(Debug)]
pub struct LogManager {
    dir: PathBuf,
    default_config: LogConfig,
    logs: RwLock<BTreeMap<TopicPartition, Arc<Log>>>,
    /// Serializes checkpoint writes (they share a temp file name) and remembers
    /// what was last written: (recovery points, high watermarks).
    last_checkpoint: Mutex<Option<Checkpoints>>,
    /// The partition the scrubber goes on with.
    scrub_next: Mutex<Option<TopicPartition>>,
    /// Partitions whose log could not be opened at start (out of descriptors, an
    /// unreadable file): their checkpointed recovery point and high watermark, kept in
    /// the checkpoint files and used when a later [`LogManager::get_or_create`] opens
    /// them, so one bad partition neither stops the broker nor loses its place.
    unopened: Mutex<BTreeMap<TopicPartition, Place>>,
    /// Why each partition that is not served could not be opened (the last error).
    offline: Mutex<BTreeMap<TopicPartition, String>>,
    /// The partitions that are offline or damaged, as of the last
    /// [`LogManager::refresh_health`]: what Metadata, metrics and the replica fetchers read.
    health: RwLock<Arc<BTreeMap<TopicPartition, Unhealthy>>>,
    /// Held until [`LogManager::close`] or drop (see [`LOCK_FILE`]).
    lock: Mutex<Option<File>>,
}

/// Why a partition of this log dir is not fully served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unhealthy {
    /// Its log could not be opened: nothing of it is served.
    Offline {
        /// The error.
        reason: String,
    },
    /// Its log holds a damaged batch: reads at and after it answer CORRUPT_MESSAGE.
    Damaged {
        /// The damaged segment's `.log`.
        segment: PathBuf,
        /// Byte position of the first bad batch found in it.
        position: u64,
    },
}

impl std::fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unhealthy::Offline { reason } => write!(f, "offline: cannot open the log: {reason}"),
            Unhealthy::Damaged { segment, position } => {
                write!(f, "damaged: corrupt batch at byte {position} of {}", segment.display())
            }
        }
    }
}

/// An unopened partition's checkpointed recovery point, high watermark and log start
/// (with the format of the file it came from: see [`crate::log_start`]).
pub(crate) type Place = (Offset, Option<Offset>, Option<(Offset, Format)>);
type Checkpoints = (BTreeMap<TopicPartition, Offset>, BTreeMap<TopicPartition, Offset>, BTreeMap<TopicPartition, Offset>);

impl LogManager {
    /// Opens (creating if needed) the log dir and every `<topic>-<partition>`
    /// directory in it, trusting data below each partition's checkpointed recovery
    /// point and restoring its high watermark. Other entries are ignored with a
    /// warning; a malformed checkpoint is ignored with a warning (all partitions are
    /// then fully re-validated).
    pub fn open(dir: impl Into<PathBuf>, default_config: LogConfig) -> Result<LogManager> {
        default_config.validate()?;
        let dir = dir.into();
        fs::create_dir_all(&dir).at(&dir)?;
        let lock = lock_log_dir(&dir)?;
        // A damaged or unreadable checkpoint is not trusted at all (a flipped digit in a
        // recovery point would skip the CRC scan of unflushed data): without recovery
        // points every partition's log is re-validated from its start; without high
        // watermarks they start at the log start and move up as replication (or, alone,
        // the next leader append) sets them.
        let read = |name: &str, then: &str| {
            checkpoint::read_offsets(&dir.join(name)).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "checkpoint damaged or unreadable: {then}");
                BTreeMap::new()
            })
        };
        let recovery_points = read(RECOVERY_POINT_CHECKPOINT, "re-validating every partition's log from its start");
        let high_watermarks = read(REPLICATION_CHECKPOINT, "high watermarks restart at the log start");
        // Not trusted alike: a version 0 file's values are checked against each log
        // (crate::log_start), and rewritten checksummed at the next checkpoint.
        let (log_starts, log_start_format) = checkpoint::read_offsets_with_format(&dir.join(LOG_START_CHECKPOINT))
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "checkpoint damaged or unreadable: log start offsets restart at the first segment");
                (BTreeMap::new(), Format::Checksummed)
            });
        let mut logs = BTreeMap::new();
        let mut unopened = BTreeMap::new();
        let mut offline = BTreeMap::new();
        let mut orphans = 0;
        for entry in fs::read_dir(&dir).at(&dir)? {
            let entry = entry.at(&dir)?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if !path.is_dir() {
                if !KNOWN_FILES.contains(&name.as_str()) && !name.ends_with(".tmp") {
                    tracing::warn!(path = %path.display(), "ignoring unexpected file in the log dir");
                }
                continue;
            }
            if orphan_name(&name).is_some() {
                orphans += 1;
                continue;
            }
            if name.ends_with(crate::log_dirs::FUTURE_SUFFIX) {
                // A replica move that stopped before its copy was complete: the partition is
                // served from where it was; the copy is replaced by the next move.
                tracing::warn!(path = %path.display(), "an interrupted replica move left this partial copy; it is not loaded (the partition is served from its source); delete it or move the replica again");
                continue;
            }
            if crate::repair::is_side_dir(&name) {
                // What a repair cut off: kept for the operator, never loaded.
                continue;
            }
            let Some(tp) = parse_partition_dir(&name) else {
                // `__`-prefixed directories belong to the components that share the log dir
                // (the broker's embedded metadata store), `secure` holds `fjord dev
                // --secure`'s keys (no partition directory has a name without `-N`):
                // expected, so not worth a warning.
                if name.starts_with("__") || name == "secure" {
                    tracing::debug!(path = %path.display(), "leaving a non-partition directory alone");
                    continue;
                }
                tracing::warn!(path = %path.display(), "ignoring a directory that is not <topic>-<partition>");
                continue;
            };
            let recovery_point = recovery_points.get(&tp).copied().unwrap_or(0);
            let high_watermark = high_watermarks.get(&tp).copied();
            let log_start = log_starts.get(&tp).map(|&start| (start, log_start_format));
            match open_log(&path, default_config, recovery_point) {
                Ok(log) => {
                    restore(&log, high_watermark, log_start);
                    logs.insert(tp, Arc::new(log));
                }
                // One partition that cannot be opened must not keep the others from
                // being served: it stays offline, its directory untouched, and the
                // broker's next attempt to host it ([`LogManager::get_or_create`]) tries again.
                Err(e) => {
                    tracing::error!(
                        partition = %tp,
                        path = %path.display(),
                        error = %e,
                        "cannot open this partition's log: it stays offline and on disk as it is; the other partitions are served"
                    );
                    offline.insert(tp.clone(), e.to_string());
                    unopened.insert(tp, (recovery_point, high_watermark, log_start));
                }
            }
        }
        if orphans > 0 {
            tracing::warn!(
                log_dir = %dir.display(),
                orphans,
                "the log dir keeps logs moved aside as unknown to the metadata; `fjord logs orphans` lists them and deletes them on request"
            );
        }
        let manager = LogManager {
            dir,
            default_config,
            logs: RwLock::new(logs),
            last_checkpoint: Mutex::new(None),
            scrub_next: Mutex::new(None),
            unopened: Mutex::new(unopened),
            offline: Mutex::new(offline),
            health: RwLock::new(Arc::new(BTreeMap::new())),
            lock: Mutex::new(Some(lock)),
        };
        manager.refresh_health();
        Ok(manager)
    }

    /// The partitions that are offline (their log could not be opened) or damaged (a
    /// read, the open or the scrubber found a bad batch), as of the last
    /// [`LogManager::refresh_health`]: cheap, for every Metadata request.
    pub fn unhealthy(&self) -> Arc<BTreeMap<TopicPartition, Unhealthy>> {
        lock::read(&self.health).clone()
    }

    /// Recomputes [`LogManager::unhealthy`] (call it every second or so, and after a
    /// repair): walks every partition's segment list once. Logs a partition that
    /// became healthy again.
    pub fn refresh_health(&self) {
        let mut health = BTreeMap::new();
        for (tp, reason) in lock::mutex(&self.offline).iter() {
            health.insert(tp.clone(), Unhealthy::Offline { reason: reason.clone() });
        }
        for (tp, log) in lock::read(&self.logs).iter() {
            if let Some((segment, position)) = log.damage().into_iter().next() {
                health.insert(tp.clone(), Unhealthy::Damaged { segment, position });
            }
        }
        let mut current = lock::write(&self.health);
        for tp in current.keys().filter(|tp| !health.contains_key(*tp)) {
            tracing::info!(partition = %tp, "the partition's log is healthy again");
        }
        *current = Arc::new(health);
    }

    /// The log dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The partition's log, if this log dir holds it.
    pub fn get(&self, tp: &TopicPartition) -> Option<Arc<Log>> {
        lock::read(&self.logs).get(tp).cloned()
    }

    /// The partition's log, created with `config` when missing (an existing log
    /// gets `config` applied).
    pub fn get_or_create(&self, tp: &TopicPartition, config: LogConfig) -> Result<Arc<Log>> {
        if let Some(log) = self.get(tp) {
            log.update_config(config)?;
            return Ok(log);
        }
        if parse_partition_dir(&tp.dir_name()).as_ref() != Some(tp) || tp.topic.contains(['/', '\\']) {
            return Err(Error::InvalidConfig {
                key: "topic".to_owned(),
                value: tp.to_string(),
                reason: "not a valid topic-partition directory name",
            });
        }
        let mut logs = lock::write(&self.logs);
        if let Some(log) = logs.get(tp) {
            return Ok(log.clone());
        }
        let dir = self.dir.join(tp.dir_name());
        let unopened = lock::mutex(&self.unopened).get(tp).copied();
        let opened = match unopened {
            Some((recovery_point, high_watermark, log_start)) => open_log(&dir, config, recovery_point).inspect(|log| {
                restore(log, high_watermark, log_start);
                lock::mutex(&self.unopened).remove(tp);
            }),
            None => open_log(&dir, config, 0),
        };
        let log = match opened {
            Ok(log) => Arc::new(log),
            Err(e) => {
                lock::mutex(&self.offline).insert(tp.clone(), e.to_string());
                return Err(e);
            }
        };
        let was_offline = lock::mutex(&self.offline).remove(tp).is_some();
        logs.insert(tp.clone(), log.clone());
        drop(logs);
        if was_offline {
            // Opens now: no longer listed as offline (Metadata, the published listing)
            // from this moment, not from the next periodic refresh.
            self.refresh_health();
        }
        Ok(log)
    }

    /// The topic id recorded in the partition's directory (`partition.metadata`), whether
    /// or not its log is open; `Ok(None)` when none is recorded.
    pub fn topic_id(&self, tp: &TopicPartition) -> Result<Option<TopicId>> {
        partition_metadata::read(&self.dir.join(tp.dir_name()))
    }

    /// Records `id` as the topic of the partition's open log, durably.
    pub fn write_topic_id(&self, tp: &TopicPartition, id: &TopicId) -> Result<()> {
        let log = self.get(tp).ok_or_else(|| Error::Io {
            path: self.dir.join(tp.dir_name()),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "the partition's log is not open"),
        })?;
        partition_metadata::write(log.dir(), id)
    }

    /// Stops serving the partition's open log because of `reason` (a damaged file the log
    /// itself does not read, such as `partition.metadata`): the log is closed and listed
    /// offline from now, its directory and checkpointed place kept as they are, so a later
    /// [`LogManager::get_or_create`] opens it again once it is repaired.
    pub fn take_offline(&self, tp: &TopicPartition, reason: String) {
        let removed = lock::write(&self.logs).remove(tp);
        if let Some(log) = removed {
            if let Err(e) = log.close() {
                // Its data is whole up to the last flush; the recovery point says where that is.
                tracing::warn!(partition = %tp, error = %e, "closing a log taken offline failed");
            }
            let log_start = Some((log.log_start_offset(), Format::Checksummed));
            lock::mutex(&self.unopened).insert(tp.clone(), (log.recovery_point(), Some(log.high_watermark()), log_start));
        }
        lock::mutex(&self.offline).insert(tp.clone(), reason);
        self.refresh_health();
    }

    /// Stops holding the partition's open log without closing it or touching its files
    /// (a replica move: [`crate::LogDirs::move_replica`] closes it and copies its files).
    pub(crate) fn detach(&self, tp: &TopicPartition) -> Option<Arc<Log>> {
        lock::write(&self.logs).remove(tp)
    }

    /// Opens a partition directory just moved into this log dir, with the place its log
    /// had where it was (recovery point, high watermark, log start).
    pub(crate) fn open_moved(&self, tp: &TopicPartition, config: LogConfig, place: Place) -> Result<Arc<Log>> {
        lock::mutex(&self.unopened).insert(tp.clone(), place);
        let opened = self.get_or_create(tp, config);
        lock::mutex(&self.unopened).remove(tp);
        lock::mutex(&self.offline).remove(tp);
        opened
    }

    /// Whether the partition's log could not be opened here (the last attempt failed).
    pub fn is_offline(&self, tp: &TopicPartition) -> bool {
        lock::mutex(&self.offline).contains_key(tp)
    }

    /// The partitions whose log could not be opened here.
    pub fn offline_partitions(&self) -> Vec<TopicPartition> {
        lock::mutex(&self.offline).keys().cloned().collect()
    }

    /// The default config partitions were opened with.
    pub fn default_config(&self) -> LogConfig {
        self.default_config
    }

    /// Every partition in this log dir.
    pub fn partitions(&self) -> Vec<TopicPartition> {
        lock::read(&self.logs).keys().cloned().collect()
    }

    /// Deletes the partition's log and directory (no-op when absent).
    pub fn delete(&self, tp: &TopicPartition) -> Result<()> {
        let log = lock::write(&self.logs).remove(tp);
        if let Some(log) = log {
            log.delete()?;
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Moves the partition's log out of the way instead of deleting it: closes it and
    /// renames its directory `<topic>-<partition>-orphan-<unix ms>` (13 digits or
    /// more, so the name never parses as a partition directory and is not loaded again).
    /// For a log the metadata does not know: its data stays on disk until an operator
    /// deletes it ([`delete_orphan`]). Returns the new path (`None` when absent).
    ///
    /// A partition whose log could not be opened ([`LogManager::is_offline`]) has its
    /// directory moved aside as it is (when there is one) and is then no longer offline
    /// here: not listed by [`LogManager::unhealthy`], nor kept in the checkpoints. That is
    /// the way out of offline for a replica this broker no longer holds (its topic
    /// deleted, the partition reassigned away), as opening it is for one it holds.
    pub fn move_aside(&self, tp: &TopicPartition, now_ms: u64) -> Result<Option<PathBuf>> {
        let removed = lock::write(&self.logs).remove(tp);
        let from = match removed {
            Some(log) => {
                if let Err(e) = log.close() {
                    // Its data is whole up to the last flush; a later load would recover the rest.
                    tracing::warn!(partition = %tp, error = %e, "closing a log before moving it aside failed");
                }
                log.dir().to_path_buf()
            }
            None if self.is_offline(tp) => {
                let dir = self.dir.join(tp.dir_name());
                let moved = if fs::symlink_metadata(&dir).is_ok() { Some(self.rename_aside(tp, &dir, now_ms)?) } else { None };
                lock::mutex(&self.offline).remove(tp);
                lock::mutex(&self.unopened).remove(tp);
                self.checkpoint()?;
                self.refresh_health();
                return Ok(moved);
            }
            None => return Ok(None),
        };
        let to = self.rename_aside(tp, &from, now_ms)?;
        self.checkpoint()?;
        Ok(Some(to))
    }

    /// Renames `from` to the partition's first free `-orphan-<ms>` name, durably.
    fn rename_aside(&self, tp: &TopicPartition, from: &Path, now_ms: u64) -> Result<PathBuf> {
        let mut ms = now_ms;
        let to = loop {
            let to = self.dir.join(format!("{}{ORPHAN_MARKER}{ms:013}", tp.dir_name()));
            if !to.exists() {
                break to;
            }
            ms += 1;
        };
        fs::rename(from, &to).at(from)?;
        checkpoint::sync_dir(&self.dir)?;
        Ok(to)
    }

    /// Writes both checkpoint files atomically (temp file, fsync, rename, fsync dir).
    pub fn checkpoint(&self) -> Result<()> {
        self.write_checkpoints(true)
    }

    /// Writes the checkpoints when `always` or when a recovery point or high
    /// watermark changed since the last write.
    fn write_checkpoints(&self, always: bool) -> Result<()> {
        let mut last = lock::mutex(&self.last_checkpoint);
        let logs: Vec<(TopicPartition, Arc<Log>)> = lock::read(&self.logs).iter().map(|(t, l)| (t.clone(), l.clone())).collect();
        let collect = |f: fn(&Log) -> Offset| -> BTreeMap<TopicPartition, Offset> {
            logs.iter().map(|(tp, log)| (tp.clone(), f(log))).collect()
        };
        let mut current = (collect(Log::recovery_point), collect(Log::high_watermark), collect(Log::log_start_offset));
        // A partition that could not be opened keeps its entries until it is.
        for (tp, &(recovery_point, high_watermark, log_start)) in lock::mutex(&self.unopened).iter() {
            current.0.entry(tp.clone()).or_insert(recovery_point);
            if let Some(hw) = high_watermark {
                current.1.entry(tp.clone()).or_insert(hw);
            }
            // An unchecksummed start is carried over only once its log agreed with it:
            // written out now it would come back checksummed, and be trusted.
            if let Some((start, Format::Checksummed)) = log_start {
                current.2.entry(tp.clone()).or_insert(start);
            }
        }
        if !always && last.as_ref() == Some(&current) {
            return Ok(());
        }
        checkpoint::write_offsets(&self.dir.join(RECOVERY_POINT_CHECKPOINT), &current.0)?;
        checkpoint::write_offsets(&self.dir.join(REPLICATION_CHECKPOINT), &current.1)?;
        checkpoint::write_offsets(&self.dir.join(LOG_START_CHECKPOINT), &current.2)?;
        *last = Some(current);
        Ok(())
    }

    /// The periodic task (call it every second or so): flushes every log whose last
    /// flush is older than its `flush.ms` at `now_ms`, then rewrites the checkpoint
    /// files if any recovery point or high watermark moved (flushes triggered by
    /// `flush.messages`, truncations and high watermark updates included).
    pub fn flush_due(&self, now_ms: i64) -> Result<()> {
        for log in self.logs() {
            log.flush_if_due(now_ms)?;
        }
        self.write_checkpoints(false)
    }

    /// Applies retention to every log; returns the number of segments deleted.
    pub fn apply_retention(&self, now_ms: i64) -> Result<usize> {
        let mut deleted = 0;
        for log in self.logs() {
            deleted += log.apply_retention(now_ms)?;
        }
        Ok(deleted)
    }

    /// The periodic scrubber (call it every second or so with that second's share of
    /// the scrub rate): CRC-checks up to `budget` bytes, one partition after the other,
    /// each going on where it stopped (see [`Log::scrub`]). A partition that cannot be
    /// read is skipped with a warning. Returns the bytes checked.
    pub fn scrub(&self, budget: u64) -> u64 {
        let logs: Vec<(TopicPartition, Arc<Log>)> = lock::read(&self.logs).iter().map(|(t, l)| (t.clone(), l.clone())).collect();
        if logs.is_empty() {
            return 0;
        }
        let mut next = lock::mutex(&self.scrub_next);
        let first = next.as_ref().map_or(0, |tp| logs.partition_point(|(t, _)| t < tp) % logs.len());
        let mut checked = 0;
        for i in 0..logs.len() {
            let (tp, log) = &logs[(first + i) % logs.len()];
            match log.scrub(budget - checked) {
                Ok((bytes, finished)) => {
                    checked += bytes;
                    if !finished || checked >= budget {
                        // Go on with this partition, or start with the next one.
                        let resume = if finished { &logs[(first + i + 1) % logs.len()].0 } else { tp };
                        *next = Some(resume.clone());
                        return checked;
                    }
                }
                Err(e) => tracing::warn!(partition = %tp, error = %e, "scrubbing a partition failed; going on with the next"),
            }
        }
        *next = None;
        checked
    }

    /// Flushes and closes every log and checkpoints: the next open needs no
    /// recovery scan. Then releases the log dir's lock.
    pub fn close(&self) -> Result<()> {
        for log in self.logs() {
            log.close()?;
        }
        self.checkpoint()?;
        lock::mutex(&self.lock).take();
        Ok(())
    }

    fn logs(&self) -> Vec<Arc<Log>> {
        lock::read(&self.logs).values().cloned().collect()
    }
}

/// Takes the exclusive lock of a log dir ([`LOCK_FILE`]), held until the file is dropped;
/// [`Error::InUse`] when a broker (or a tool) holds it.
pub fn lock_log_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path).at(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(Error::InUse { path: dir.to_path_buf() }),
        Err(fs::TryLockError::Error(source)) => Err(Error::Io { path, source }),
    }
}

/// A log directory moved aside by [`LogManager::move_aside`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// The directory.
    pub path: PathBuf,
    /// The partition it held.
    pub partition: TopicPartition,
    /// When it was moved aside, ms since the epoch.
    pub moved_at_ms: u64,
    /// Bytes of the files in it.
    pub bytes: u64,
}

/// Opens a partition's log, refusing one whose `partition.metadata` is damaged (it says
/// which topic the data belongs to; nothing decides that without it).
fn open_log(dir: &Path, config: LogConfig, recovery_point: Offset) -> Result<Log> {
    if let Err(e @ Error::MalformedPartitionMetadata { .. }) = partition_metadata::read(dir) {
        return Err(e);
    }
    Log::open_with_recovery_point(dir, config, recovery_point)
}

/// Applies a partition's checkpointed high watermark and log start offset to its
/// freshly opened log. The start only hides records, never deletes a segment, and an
/// unchecksummed one only where the log agrees with it ([`log_start::decide`]).
fn restore(log: &Log, high_watermark: Option<Offset>, log_start: Option<(Offset, Format)>) {
    if let Some((start, format)) = log_start {
        let opened = log_start::Opened {
            first_offset: log.log_start_offset(),
            log_end: log.log_end_offset(),
            first_epoch_start: log.leader_epochs().first().map(|&(_, offset)| offset),
        };
        match log_start::decide(start, format, opened) {
            Decision::Nothing => {}
            // Failing here leaves the start at the first segment: records DeleteRecords
            // removed may be readable again, which is logged, not a reason to stay offline.
            Decision::Hide(offset) => {
                if let Err(e) = log.restore_log_start(offset) {
                    tracing::warn!(dir = %log.dir().display(), log_start = offset, error = %e, "cannot restore the checkpointed log start offset");
                }
            }
            Decision::Ignore(why) => tracing::warn!(
                dir = %log.dir().display(),
                checkpointed = start,
                log_start = opened.first_offset,
                log_end = opened.log_end,
                first_epoch_start = ?opened.first_epoch_start,
                why,
                "ignoring the checkpointed log start offset: the start stays at the first segment, every record is kept"
            ),
        }
    }
    if let Some(hw) = high_watermark {
        log.set_high_watermark(hw);
    }
}

/// The orphaned log directories in `log_dir`, sorted by name.
pub fn orphans(log_dir: &Path) -> Result<Vec<Orphan>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(log_dir).at(log_dir)? {
        let entry = entry.at(log_dir)?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((partition, moved_at_ms)) = orphan_name(&name) else { continue };
        if !path.is_dir() {
            continue;
        }
        let mut bytes = 0;
        for file in fs::read_dir(&path).at(&path)? {
            bytes += file.at(&path)?.metadata().at(&path)?.len();
        }
        found.push(Orphan { path, partition, moved_at_ms, bytes });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// Deletes an orphaned log directory (the operator's explicit command). Refuses any
/// path whose name is not an orphan's, so a live partition is never hit by mistake.
pub fn delete_orphan(path: &Path) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if orphan_name(&name).is_none() {
        return Err(Error::InvalidConfig {
            key: "orphan".to_owned(),
            value: path.display().to_string(),
            reason: "not an orphaned log directory (<topic>-<partition>-orphan-<unix ms>)",
        });
    }
    fs::remove_dir_all(path).at(path)
}

/// `orders-3-orphan-1764600000000` → (`orders`, 3), 1764600000000.
fn orphan_name(name: &str) -> Option<(TopicPartition, u64)> {
    let (partition_dir, ms) = name.rsplit_once(ORPHAN_MARKER)?;
    if ms.len() < 13 || !ms.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((parse_partition_dir(partition_dir)?, ms.parse().ok()?))
}

/// `orders-3` → `orders`, 3; topic names may contain `-`, the last one splits.
fn parse_partition_dir(name: &str) -> Option<TopicPartition> {
    let (topic, partition) = name.rsplit_once('-')?;
    let partition: i32 = partition.parse().ok()?;
    if topic.is_empty() || partition < 0 || partition.to_string().len() != name.len() - topic.len() - 1 {
        return None;
    }
    Some(TopicPartition::new(topic, partition))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{batch, config};
    use std::time::Duration;

    #[test]
    fn a_partition_that_cannot_be_opened_stays_offline_and_keeps_its_place_while_the_others_open() {
        let dir = tempfile::tempdir().unwrap();
        let (good, bad) = (TopicPartition::new("good", 0), TopicPartition::new("bad", 0));
        {
            let m = LogManager::open(dir.path(), config()).unwrap();
            for tp in [&good, &bad] {
                let log = m.get_or_create(tp, config()).unwrap();
                log.append(&mut batch(3), 0).unwrap();
                log.set_high_watermark(3);
                log.close().unwrap();
            }
            m.checkpoint().unwrap();
        }
        // The bad partition's segment becomes unreadable: a directory where its file was.
        let segment = dir.path().join(bad.dir_name()).join("00000000000000000000.log");
        std::fs::rename(&segment, dir.path().join("aside.log")).unwrap();
        std::fs::create_dir(&segment).unwrap();

        let m = LogManager::open(dir.path(), config()).unwrap();
        assert_eq!(m.partitions(), vec![good.clone()], "the good partition is served, the bad one is offline");
        let health = m.unhealthy();
        assert_eq!(health.keys().collect::<Vec<_>>(), vec![&bad], "only the bad partition is reported");
        let Some(Unhealthy::Offline { reason }) = health.get(&bad) else { panic!("{health:?}") };
        assert!(reason.contains("00000000000000000000.log"), "the reason names the file: {reason}");
        assert!(m.get_or_create(&bad, config()).is_err(), "a later attempt fails the same way");
        m.checkpoint().unwrap();
        let points = checkpoint::read_offsets(&dir.path().join(REPLICATION_CHECKPOINT)).unwrap();
        assert_eq!(points.get(&bad), Some(&3), "the offline partition keeps its high watermark in the checkpoint");

        // Repaired by hand, it opens with its checkpointed place.
        std::fs::remove_dir(&segment).unwrap();
        std::fs::rename(dir.path().join("aside.log"), &segment).unwrap();
        let log = m.get_or_create(&bad, config()).unwrap();
        assert_eq!((log.log_end_offset(), log.high_watermark()), (3, 3));
        assert!(m.unhealthy().is_empty(), "healthy as soon as it opens, not at the next refresh");
        assert!(!m.is_offline(&bad));
    }

    #[test]
    fn an_offline_partition_moved_aside_is_no_longer_offline_and_keeps_its_bytes() {
        // The way out of offline for a replica that is no longer this broker's (its topic
        // deleted, reassigned away): before, it stayed listed offline until a restart, and
        // a topic created again under the name met the same unopenable directory.
        let dir = tempfile::tempdir().unwrap();
        let bad = TopicPartition::new("bad", 0);
        {
            let m = LogManager::open(dir.path(), config()).unwrap();
            let log = m.get_or_create(&bad, config()).unwrap();
            log.append(&mut batch(3), 0).unwrap();
            log.set_high_watermark(3);
            log.close().unwrap();
            m.checkpoint().unwrap();
        }
        let segment = dir.path().join(bad.dir_name()).join("00000000000000000000.log");
        let kept = std::fs::read(&segment).unwrap();
        std::fs::remove_file(&segment).unwrap();
        std::fs::create_dir(&segment).unwrap();
        std::fs::write(segment.join("inside"), &kept).unwrap();

        let m = LogManager::open(dir.path(), config()).unwrap();
        assert!(m.is_offline(&bad));
        assert_eq!(m.offline_partitions(), vec![bad.clone()]);
        let moved = m.move_aside(&bad, 1_700_000_000_000).unwrap().expect("its directory is moved aside");
        assert!(orphan_name(&moved.file_name().unwrap().to_string_lossy()).is_some(), "{moved:?}");
        assert_eq!(std::fs::read(moved.join("00000000000000000000.log").join("inside")).unwrap(), kept, "nothing deleted");
        assert!(!m.is_offline(&bad) && m.unhealthy().is_empty(), "no longer offline, at once");
        let points = checkpoint::read_offsets(&dir.path().join(REPLICATION_CHECKPOINT)).unwrap();
        assert_eq!(points.get(&bad), None, "no longer checkpointed");
        // The name is free again: a new replica of it starts empty and healthy.
        let log = m.get_or_create(&bad, config()).unwrap();
        assert_eq!(log.log_end_offset(), 0);
        assert_eq!(m.move_aside(&TopicPartition::new("absent", 0), 1).unwrap(), None, "nothing to move");
    }

    #[test]
    fn a_damaged_log_is_reported_until_repaired_and_a_second_manager_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        let m = LogManager::open(dir.path(), config()).unwrap();
        assert!(matches!(LogManager::open(dir.path(), config()), Err(Error::InUse { .. })), "one broker per log dir");
        let log = m.get_or_create(&tp, config()).unwrap();
        for _ in 0..3 {
            log.append(&mut batch(3), 0).unwrap();
        }
        let segment = dir.path().join("t-0").join("00000000000000000000.log");
        let mut bytes = std::fs::read(&segment).unwrap();
        let second = fjord_record::BatchHeader::parse(&bytes).unwrap().size();
        bytes[second + 80] ^= 1;
        std::fs::write(&segment, bytes).unwrap();
        m.scrub(u64::MAX);
        assert!(m.unhealthy().is_empty(), "read at the next refresh");
        m.refresh_health();
        let health = m.unhealthy();
        assert_eq!(health.get(&tp), Some(&Unhealthy::Damaged { segment: segment.clone(), position: second as u64 }));
        assert!(health.get(&tp).unwrap().to_string().contains(&format!("byte {second} of")));
        log.repair(1_764_600_000_000).unwrap().unwrap();
        m.refresh_health();
        assert!(m.unhealthy().is_empty());
        m.close().unwrap();
        LogManager::open(dir.path(), config()).unwrap();
    }

    #[test]
    fn delete_records_moves_the_log_start_deletes_whole_segments_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let m = LogManager::open(dir.path(), config()).unwrap();
        let tp = TopicPartition::new("t", 0);
        let log = m.get_or_create(&tp, config()).unwrap();
        for _ in 0..10 {
            log.append(&mut batch(3), 0).unwrap();
        }
        log.set_high_watermark(30);
        let segments = |dir: &Path| {
            fs::read_dir(dir.join("t-0"))
                .unwrap()
                .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "log"))
                .count()
        };
        let before = segments(dir.path());
        assert!(before > 3, "{before} segments");
        // 13 falls inside a batch (12..15) of a kept segment: reads below it are out of range.
        assert_eq!(log.delete_records_before(13).unwrap(), 13);
        assert_eq!(log.log_start_offset(), 13);
        assert!(segments(dir.path()) < before, "whole segments below 13 are deleted");
        assert!(matches!(log.read(12, 1000, None, true), Err(Error::OffsetOutOfRange { log_start: 13, .. })));
        assert!(log.read(13, 1000, None, true).is_ok());
        // Lower than the start: no change. Past the end: refused.
        assert_eq!(log.delete_records_before(5).unwrap(), 13);
        assert!(matches!(log.delete_records_before(31), Err(Error::OffsetOutOfRange { .. })));
        // Retention never moves the start back to the first segment's base.
        log.apply_retention(0).unwrap();
        assert_eq!(log.log_start_offset(), 13);
        m.checkpoint().unwrap();
        drop(log);
        drop(m); // a crash: the checkpoint keeps the start

        let m = LogManager::open(dir.path(), config()).unwrap();
        assert_eq!(m.get(&tp).unwrap().log_start_offset(), 13);
        assert_eq!(m.get(&tp).unwrap().high_watermark(), 30);
        m.close().unwrap();
        let m = LogManager::open(dir.path(), config()).unwrap();
        assert_eq!(m.get(&tp).unwrap().log_start_offset(), 13, "and across a clean shutdown");
    }

    #[test]
    fn a_checkpointed_log_start_hides_records_but_never_deletes_a_segment() {
        // A checksummed start past the first segments (their deletion by DeleteRecords was
        // lost in a crash, or the file says so for any other reason): the records below
        // it are hidden, and every segment file stays on disk (#26).
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("t", 0);
        {
            let m = LogManager::open(dir.path(), config()).unwrap();
            let log = m.get_or_create(&tp, config()).unwrap();
            for _ in 0..10 {
                log.append(&mut batch(3), 0).unwrap();
            }
            log.set_high_watermark(30);
            m.close().unwrap();
        }
        let files = || {
            let names = fs::read_dir(dir.path().join("t-0")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap());
            names.filter(|n| n.ends_with(".log")).count()
        };
        let before = files();
        let path = dir.path().join(LOG_START_CHECKPOINT);
        checkpoint::write_offsets(&path, &BTreeMap::from([(tp.clone(), 22)])).unwrap();
        let m = LogManager::open(dir.path(), config()).unwrap();
        let log = m.get(&tp).unwrap();
        assert_eq!(log.log_start_offset(), 22);
        assert!(log.segment_count() > 3, "the segments wholly below 22 are still there: {}", log.segment_count());
        assert_eq!(files(), before, "no segment deleted or renamed");
        assert!(matches!(log.read(21, 1000, None, true), Err(Error::OffsetOutOfRange { log_start: 22, .. })));
        assert!(log.read(22, 1000, None, true).is_ok());
        // DeleteRecords (or retention) removes them as it would any other.
        assert_eq!(log.delete_records_before(23).unwrap(), 23);
        assert!(files() < before);
    }

    #[test]
    fn partitions_and_checkpoints_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let m = LogManager::open(dir.path(), config()).unwrap();
        let a = TopicPartition::new("my-topic", 0);
        let b = TopicPartition::new("orders", 11);
        let la = m.get_or_create(&a, config()).unwrap();
        let lb = m.get_or_create(&b, config()).unwrap();
        assert!(Arc::ptr_eq(&la, &m.get_or_create(&a, config()).unwrap()));
        for _ in 0..10 {
            la.append(&mut batch(3), 0).unwrap();
        }
        lb.append(&mut batch(2), 0).unwrap();
        la.set_high_watermark(21);
        la.flush().unwrap();
        m.checkpoint().unwrap();
        let rp = fs::read_to_string(dir.path().join(RECOVERY_POINT_CHECKPOINT)).unwrap();
        assert!(rp.starts_with("1\n2\nmy-topic 0 30\norders 11 0\ncrc32c "), "{rp}");
        let hw = fs::read_to_string(dir.path().join(REPLICATION_CHECKPOINT)).unwrap();
        assert!(hw.starts_with("1\n2\nmy-topic 0 21\norders 11 0\ncrc32c "), "{hw}");
        lb.append(&mut batch(2), 0).unwrap();
        drop((la, lb));
        drop(m); // a crash: no close, the checkpoints say what was flushed

        fs::write(dir.path().join("stray.txt"), "x").unwrap();
        fs::create_dir(dir.path().join("not_a_partition")).unwrap();
        let m = LogManager::open(dir.path(), config()).unwrap();
        assert_eq!(m.partitions(), vec![a.clone(), b.clone()]);
        let la = m.get(&a).unwrap();
        assert_eq!((la.log_end_offset(), la.recovery_point(), la.high_watermark()), (30, 30, 21));
        let lb = m.get(&b).unwrap();
        assert_eq!((lb.log_end_offset(), lb.recovery_point()), (4, 0));
        m.close().unwrap();
        let m = LogManager::open(dir.path(), config()).unwrap();
        assert_eq!(m.get(&b).unwrap().recovery_point(), 4);

        m.delete(&a).unwrap();
        assert!(!dir.path().join("my-topic-0").exists());
        assert_eq!(m.partitions(), vec![b]);
        let rp = fs::read_to_string(dir.path().join(RECOVERY_POINT_CHECKPOINT)).unwrap();
        assert!(rp.starts_with("1\n1\norders 11 4\n"), "{rp}");
    }

    #[test]
    fn flush_and_retention_policies_run_over_all_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig { flush_ms: Some(Duration::from_millis(10)), retention_bytes: Some(200), ..config() };
        let m = LogManager::open(dir.path(), config).unwrap();
        let log = m.get_or_create(&TopicPartition::new("t", 0), config).unwrap();
        for _ in 0..20 {
            log.append(&mut batch(2), 0).unwrap();
        }
        assert_eq!(log.recovery_point(), 0);
        m.flush_due(i64::MAX / 2).unwrap();
        assert_eq!(log.recovery_point(), 40);
        assert!(fs::read_to_string(dir.path().join(RECOVERY_POINT_CHECKPOINT)).unwrap().contains("t 0 40"));
        // A moved high watermark is checkpointed on the next run, with nothing to flush.
        log.set_high_watermark(10);
        m.flush_due(0).unwrap();
        assert!(fs::read_to_string(dir.path().join(REPLICATION_CHECKPOINT)).unwrap().contains("t 0 10"));
        assert!(m.apply_retention(0).unwrap() > 0);
        assert!(log.log_start_offset() > 0);
    }

    #[test]
    fn malformed_checkpoints_and_bad_names_are_handled() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(RECOVERY_POINT_CHECKPOINT), "garbage").unwrap();
        let m = LogManager::open(dir.path(), config()).unwrap();
        assert!(m.partitions().is_empty());
        for bad in [TopicPartition::new("a/b", 0), TopicPartition::new("", 0), TopicPartition::new("t", -1)] {
            assert!(matches!(m.get_or_create(&bad, config()), Err(Error::InvalidConfig { .. })), "{bad}");
        }
    }

    #[test]
    fn partition_directory_names() {
        assert_eq!(parse_partition_dir("orders-3"), Some(TopicPartition::new("orders", 3)));
        assert_eq!(parse_partition_dir("my-topic-10"), Some(TopicPartition::new("my-topic", 10)));
        for bad in ["orders", "-1", "orders-x", "orders-01", "orders-+1"] {
            assert_eq!(parse_partition_dir(bad), None, "{bad}");
        }
        // An orphan's time has 13 digits or more: too large for a partition, or led by 0.
        for orphan in ["orders-3-orphan-1764600000000", "orders-3-orphan-0000000000000", "orders-3-orphan-99999999999999"] {
            assert_eq!(parse_partition_dir(orphan), None, "{orphan}");
            assert_eq!(orphan_name(orphan).map(|(tp, _)| tp), Some(TopicPartition::new("orders", 3)), "{orphan}");
        }
        assert_eq!(parse_partition_dir("a-orphan-b-0"), Some(TopicPartition::new("a-orphan-b", 0)));
        assert_eq!(orphan_name("a-orphan-b-0"), None);
        assert_eq!(orphan_name("orders-3-orphan-123"), None);
    }

    #[test]
    fn a_log_moved_aside_keeps_its_data_and_is_not_loaded_again() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("kept", 2);
        {
            let m = LogManager::open(dir.path(), config()).unwrap();
            let log = m.get_or_create(&tp, config()).unwrap();
            log.append(&mut batch(3), 0).unwrap();
            let moved = m.move_aside(&tp, 0).unwrap().unwrap();
            assert_eq!(moved.file_name().unwrap(), "kept-2-orphan-0000000000000");
            assert!(m.get(&tp).is_none());
            assert_eq!(m.move_aside(&tp, 0).unwrap(), None);
            // Moved aside again at the same instant: the name does not collide.
            m.get_or_create(&tp, config()).unwrap();
            assert_eq!(m.move_aside(&tp, 0).unwrap().unwrap().file_name().unwrap(), "kept-2-orphan-0000000000001");
        }
        let m = LogManager::open(dir.path(), config()).unwrap();
        assert!(m.partitions().is_empty(), "an orphan is not loaded as a partition");
        let found = orphans(dir.path()).unwrap();
        assert_eq!(found.iter().map(|o| (o.partition.clone(), o.moved_at_ms)).collect::<Vec<_>>(), [(tp.clone(), 0), (tp, 1)]);
        assert!(found[0].bytes > 0, "the data is still there");
        assert!(delete_orphan(&dir.path().join("kept-2")).is_err(), "only orphans are deleted");
        delete_orphan(&found[0].path).unwrap();
        assert_eq!(orphans(dir.path()).unwrap().len(), 1);
    }
}
