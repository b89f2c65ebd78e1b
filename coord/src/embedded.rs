//! The embedded single-node store: the whole tree in memory, every change to a
//! persistent node appended to a journal file and fsynced before the call returns.
//!
//! # Journal format
//! `metadata.journal` under the store's directory. Format 2 (written since the journal
//! was versioned) is an 8-byte header, then records:
//!
//! ```text
//! header:  0xFF 'F' 'J' 'M' 'D' 'J' | format version u16 BE (2)
//! record:  length u32 BE | crc32c u32 BE (of the length bytes, then the payload) | payload
//! payload: op u8 (1 create, 2 set, 3 delete) | path len u16 | path | version i32 |
//!          time_ms i64 | data len u32 | data
//! ```
//!
//! Format 1 (before the header) is the same records from byte 0, with the CRC over the
//! payload only. No format-1 journal can start with the header: its first four bytes
//! are the first record's length, and a length of 0xFF46_4A4D (4 GiB) never occurs.
//! A format-1 journal is read with the same rules as format 2, then rewritten as
//! format 2 (atomically, as a compaction) before the store opens; older builds cannot
//! read the rewritten file.
//!
//! # Integrity
//! - A failed append (disk full, I/O error, failed fsync) is cut back off the file
//!   before the call returns its error, and the tree is not changed. If even the cut
//!   fails, no later append is written until a retried cut succeeds: nothing is ever
//!   appended after a partial record, so the store works again once space returns.
//! - Replay stops only at a torn tail: a damaged record with no valid record anywhere
//!   after it (a crash during the last append, which was never acknowledged). It is cut
//!   off with a warning. A damaged record followed by a valid one is corruption in the
//!   middle: opening fails with [`Error::CorruptJournal`], naming the file and the byte
//!   offset, and the file is left as it is. Replaying past it, or cutting it off, would
//!   silently lose or misapply acknowledged changes.
//! - When the journal holds many more records than live nodes it is rewritten as one
//!   create (and set) per node: into a temporary file, fsynced, renamed over the
//!   journal, and the directory fsynced. A crash at any point leaves either the old
//!   journal or the new one. A rewrite that fails leaves the old journal in use.
//!
//! One process at a time: `open` takes an exclusive lock on `lock` in the directory
//! (held until the store is dropped), so a tool such as `fjord users --data-dir` cannot
//! append to, or compact, the journal of a running broker.
//!
//! Ephemeral nodes are never journaled: the store has exactly one session, which
//! ends with the process, as a ZooKeeper session would.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;

use crate::{join, validate_path, CreateMode, Error, MetadataStore, Result, Stat, Watch, WatchEvent};

const JOURNAL: &str = "metadata.journal";
/// The rewritten journal before it is renamed over [`JOURNAL`].
const JOURNAL_TMP: &str = "metadata.journal.tmp";
/// Starts a versioned journal; its first byte is what no format-1 journal starts with.
const MAGIC: [u8; 6] = [0xFF, b'F', b'J', b'M', b'D', b'J'];
/// The format this build writes.
const FORMAT_VERSION: u16 = 2;
/// [`MAGIC`] and the format version.
const HEADER_LEN: usize = 8;
/// Length and CRC in front of every record's payload.
const FRAME_LEN: usize = 8;
/// Held exclusively while a store has the directory open.
const LOCK: &str = "lock";
const OP_CREATE: u8 = 1;
const OP_SET: u8 = 2;
const OP_DELETE: u8 = 3;
/// Rewrite the journal when it holds this many more records than there are nodes (fewer
/// in unit tests, so a rewrite is cheap to reach).
#[cfg(not(test))]
const COMPACT_SLACK: usize = 10_000;
#[cfg(test)]
const COMPACT_SLACK: usize = 100;
/// After a failed rewrite (a full disk, say), appends before the next attempt: every
/// attempt writes the whole tree.
const COMPACT_RETRY_RECORDS: usize = 1_000;

/// How records are framed: format 1 checksums the payload, format 2 the length too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    V1,
    V2,
}

/// A single-process metadata store, durable under a directory.
#[derive(Debug)]
pub struct EmbeddedStore {
    state: Mutex<State>,
    session_id: i64,
    /// Holds the directory's exclusive lock for the store's lifetime.
    _lock: File,
}

#[derive(Debug)]
struct State {
    nodes: BTreeMap<String, Node>,
    data_watches: HashMap<String, Vec<oneshot::Sender<WatchEvent>>>,
    child_watches: HashMap<String, Vec<oneshot::Sender<WatchEvent>>>,
    journal: File,
    journal_path: PathBuf,
    /// Length of the journal up to its last complete, fsynced record: where a failed
    /// append is cut back to.
    journal_len: u64,
    journal_records: usize,
    /// A failed append could not be cut back off the file: nothing may be appended
    /// until a retried cut succeeds.
    needs_cut: bool,
    /// The journal was renamed into place but the directory's fsync failed: the rename
    /// may not survive a crash, so no append is acknowledged until the fsync succeeds.
    dir_unsynced: bool,
    /// Journal record count below which no rewrite is attempted.
    compact_at: usize,
}

#[derive(Debug, Clone)]
struct Node {
    data: Vec<u8>,
    stat: Stat,
    children: BTreeSet<String>,
    /// Next sequence number handed to a sequential child.
    next_sequence: i32,
}

impl Node {
    fn new(data: Vec<u8>, now: i64, owner: i64) -> Self {
        let stat = Stat { ephemeral_owner: owner, ctime_ms: now, mtime_ms: now, ..Stat::default() };
        Self { data, stat, children: BTreeSet::new(), next_sequence: 0 }
    }

    fn stat(&self) -> Stat {
        Stat { num_children: self.children.len() as i32, ..self.stat }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct JournalRecord {
    op: u8,
    path: String,
    version: i32,
    time_ms: i64,
    data: Vec<u8>,
}

/// What replaying a journal's bytes found.
#[derive(Debug, PartialEq, Eq)]
struct Replayed {
    /// Where the valid records end (the file is cut here when a torn tail follows).
    end: usize,
    records: usize,
    /// Bytes of a torn tail after `end`.
    torn: usize,
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir`, replaying its journal. Fails with
    /// [`Error::CorruptJournal`] when a damaged record is followed by valid ones.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
        let lock_path = dir.join(LOCK);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| Error::Io { path: lock_path.clone(), source })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(Error::InUse { path: dir.to_path_buf() }),
            Err(std::fs::TryLockError::Error(source)) => return Err(Error::Io { path: lock_path, source }),
        }
        let journal_path = dir.join(JOURNAL);
        let io = |source| Error::Io { path: journal_path.clone(), source };
        // A rewrite that a crash interrupted before its rename: the journal is whole.
        let tmp = dir.join(JOURNAL_TMP);
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::Io { path: tmp, source: e }),
            _ => {}
        }
        let mut nodes = BTreeMap::new();
        nodes.insert("/".to_string(), Node::new(Vec::new(), 0, 0));
        let mut bytes = Vec::new();
        match File::open(&journal_path) {
            Ok(mut file) => {
                file.read_to_end(&mut bytes).map_err(io)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let (format, start) = match header(&bytes) {
            Header::Empty => (None, 0),
            Header::Versioned(FORMAT_VERSION) => (Some(Format::V2), HEADER_LEN),
            Header::Versioned(version) => {
                return Err(Error::Corrupt {
                    path: journal_path,
                    detail: format!("journal format version {version}, this build reads versions 1 and {FORMAT_VERSION}"),
                })
            }
            Header::Unversioned => (Some(Format::V1), 0),
        };
        let mut replayed = Replayed { end: start, records: 0, torn: 0 };
        if let Some(format) = format {
            replayed = replay(&bytes, start, format, |at, record| {
                apply(&mut nodes, record).map_err(|detail| Error::Corrupt {
                    path: journal_path.clone(),
                    detail: format!("record at byte offset {at}: {detail}"),
                })
            })
            .map_err(|e| match e {
                ReplayError::Damaged { offset, next_valid } => {
                    Error::CorruptJournal { path: journal_path.clone(), offset: offset as u64, next_valid: next_valid as u64 }
                }
                ReplayError::Apply(e) => e,
            })?;
            if replayed.torn > 0 {
                tracing::warn!(
                    path = %journal_path.display(),
                    offset = replayed.end,
                    dropped = replayed.torn,
                    "metadata journal ends in a torn record (a crash during an append that was never acknowledged); cutting it off"
                );
            }
        }
        let session_id = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(1);
        let journal = if format == Some(Format::V2) {
            let journal = OpenOptions::new().append(true).open(&journal_path).map_err(io)?;
            if replayed.torn > 0 {
                journal.set_len(replayed.end as u64).map_err(io)?;
                journal.sync_all().map_err(io)?;
            }
            journal
        } else {
            // No journal yet, a header cut short by a crash, or format 1: the tree is
            // written as a fresh format-2 journal, atomically.
            if format == Some(Format::V1) {
                tracing::info!(
                    path = %journal_path.display(),
                    records = replayed.records,
                    "rewriting the metadata journal in format {FORMAT_VERSION}"
                );
            }
            let snapshot = write_snapshot(&nodes, &journal_path).map_err(|e| match e {
                SnapshotError::DirSync { source, .. } => io(source),
                SnapshotError::Other(e) => e,
            })?;
            replayed = Replayed { end: snapshot.len as usize, records: snapshot.records, torn: 0 };
            snapshot.journal
        };
        Ok(Self {
            state: Mutex::new(State {
                nodes,
                data_watches: HashMap::new(),
                child_watches: HashMap::new(),
                journal,
                journal_path,
                journal_len: replayed.end as u64,
                journal_records: replayed.records,
                needs_cut: false,
                dir_unsynced: false,
                compact_at: 0,
            }),
            session_id,
            _lock: lock,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the tree half-changed: every
        // mutation is computed first and applied with infallible map operations.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Ends this store's session: deletes its ephemeral nodes and fires their watches,
    /// as ZooKeeper does when a session closes.
    pub fn close_session(&self) {
        let mut state = self.lock();
        let ephemerals: Vec<String> =
            state.nodes.iter().filter(|(_, n)| n.stat.ephemeral_owner == self.session_id).map(|(p, _)| p.clone()).collect();
        for path in ephemerals {
            state.remove(&path);
        }
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.close_session();
    }
}

impl State {
    /// Appends and fsyncs one record. On error the file is as before the call (or, if
    /// even that cut failed, no later append is written until it succeeds), and the
    /// caller leaves the tree unchanged.
    fn journal(&mut self, record: JournalRecord) -> Result<()> {
        let io = |path: &Path, source| Error::Io { path: path.to_path_buf(), source };
        if self.needs_cut {
            self.cut_back().map_err(|e| io(&self.journal_path, e))?;
        }
        if self.dir_unsynced {
            sync_parent(&self.journal_path).map_err(|e| io(&self.journal_path, e))?;
            self.dir_unsynced = false;
        }
        let bytes = encode_record(&record);
        if let Err(e) = self.journal.write_all(&bytes).and_then(|()| self.journal.sync_data()) {
            // Part of the record may be in the file (a write cut short by a full disk),
            // or all of it without the fsync: either way it was not acknowledged, and no
            // later record may follow it.
            if let Err(cut) = self.cut_back() {
                tracing::error!(
                    path = %self.journal_path.display(),
                    error = %cut,
                    "cutting a failed append off the metadata journal failed; no change is written until it succeeds"
                );
            }
            return Err(io(&self.journal_path, e));
        }
        self.journal_len += bytes.len() as u64;
        self.journal_records += 1;
        Ok(())
    }

    /// Rewrites the journal when it has grown [`COMPACT_SLACK`] records past the tree.
    /// Called once a change is applied to the tree, never between its record and its
    /// application: the rewrite is the tree, so a change not yet in it was lost with the
    /// old journal (one change in ~10 000 came back after a restart: a deleted node, a
    /// set undone, a created node gone).
    fn maybe_compact(&mut self) {
        if self.journal_records > self.nodes.len() + COMPACT_SLACK && self.journal_records >= self.compact_at {
            // Every record is durable and acknowledged whatever happens here: a failed
            // rewrite leaves the journal as it is, and is tried again later.
            if let Err(e) = self.compact() {
                self.compact_at = self.journal_records + COMPACT_RETRY_RECORDS;
                tracing::warn!(error = %e, "rewriting the metadata journal failed; it keeps growing until a retry succeeds");
            }
        }
    }

    /// Cuts the journal back to its last complete record, durably.
    fn cut_back(&mut self) -> std::io::Result<()> {
        self.needs_cut = true;
        self.journal.set_len(self.journal_len)?;
        self.journal.sync_all()?;
        self.needs_cut = false;
        Ok(())
    }

    /// Rewrites the journal as one create (plus one set, to keep the version) per
    /// persistent node, parents first.
    fn compact(&mut self) -> Result<()> {
        let (snapshot, dir_sync) = match write_snapshot(&self.nodes, &self.journal_path) {
            Ok(snapshot) => (snapshot, Ok(())),
            // Renamed into place, but the directory fsync failed: the new journal is
            // the one in use, and appends wait for the fsync (see `journal`).
            Err(SnapshotError::DirSync { snapshot, source }) => (snapshot, Err(source)),
            Err(SnapshotError::Other(e)) => return Err(e),
        };
        self.journal = snapshot.journal;
        self.journal_len = snapshot.len;
        self.journal_records = snapshot.records;
        dir_sync.map_err(|source| {
            self.dir_unsynced = true;
            Error::Io { path: self.journal_path.clone(), source }
        })
    }

    fn fire(watches: &mut HashMap<String, Vec<oneshot::Sender<WatchEvent>>>, path: &str, event: WatchEvent) {
        for watch in watches.remove(path).unwrap_or_default() {
            let _ = watch.send(event); // the watcher may have stopped caring
        }
    }

    fn remove(&mut self, path: &str) {
        self.nodes.remove(path);
        let (parent, name) = split(path);
        if let Some(parent_node) = self.nodes.get_mut(parent) {
            parent_node.children.remove(name);
            parent_node.stat.cversion += 1;
        }
        Self::fire(&mut self.data_watches, path, WatchEvent::Deleted);
        Self::fire(&mut self.child_watches, path, WatchEvent::Deleted);
        Self::fire(&mut self.child_watches, parent, WatchEvent::ChildrenChanged);
    }
}

/// Splits `/a/b/c` into (`/a/b`, `c`).
fn split(path: &str) -> (&str, &str) {
    let at = path.rfind('/').expect("invariant: validated paths start with '/'");
    (if at == 0 { "/" } else { &path[..at] }, &path[at + 1..])
}

/// Milliseconds since the Unix epoch, 0 before 1970: `fjord_record::now_ms`, kept here
/// because the metadata store depends on no other Fjord crate (docs/architecture.md).
fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Replays one journal record onto the tree.
fn apply(nodes: &mut BTreeMap<String, Node>, record: &JournalRecord) -> std::result::Result<(), String> {
    let path = record.path.as_str();
    validate_path(path).map_err(|e| e.to_string())?;
    let (parent, name) = split(path);
    match record.op {
        OP_CREATE => {
            let parent_node = nodes.get_mut(parent).ok_or_else(|| format!("create of {path} without parent"))?;
            parent_node.children.insert(name.to_string());
            parent_node.stat.cversion += 1;
            // Sequential names end in 10 digits: keep the parent's counter past them.
            if let Some(seq) = name.len().checked_sub(10).and_then(|at| name[at..].parse::<i32>().ok()) {
                parent_node.next_sequence = parent_node.next_sequence.max(seq.saturating_add(1));
            }
            let mut node = Node::new(record.data.clone(), record.time_ms, 0);
            node.next_sequence = record.version;
            nodes.insert(path.to_string(), node);
        }
        OP_SET => {
            let node = nodes.get_mut(path).ok_or_else(|| format!("set of missing {path}"))?;
            node.data = record.data.clone();
            node.stat.version = record.version;
            node.stat.mtime_ms = record.time_ms;
        }
        OP_DELETE => {
            nodes.remove(path).ok_or_else(|| format!("delete of missing {path}"))?;
            if let Some(parent_node) = nodes.get_mut(parent) {
                parent_node.children.remove(name);
                parent_node.stat.cversion += 1;
            }
        }
        op => return Err(format!("unknown op {op}")),
    }
    Ok(())
}

/// A journal written afresh: the file (open for appending), its length and record count.
#[derive(Debug)]
struct Snapshot {
    journal: File,
    len: u64,
    records: usize,
}

#[derive(Debug)]
enum SnapshotError {
    /// The new journal is in place but the directory's fsync failed.
    DirSync { snapshot: Snapshot, source: std::io::Error },
    /// Nothing changed: the old journal (if any) is still the one in place.
    Other(Error),
}

/// Writes the persistent nodes as a format-2 journal at `path`, atomically: a temporary
/// file, fsynced, renamed over `path`, then the directory fsynced.
fn write_snapshot(nodes: &BTreeMap<String, Node>, path: &Path) -> std::result::Result<Snapshot, SnapshotError> {
    let tmp = path.with_file_name(JOURNAL_TMP);
    let io = |source| SnapshotError::Other(Error::Io { path: tmp.clone(), source });
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.extend(MAGIC);
    out.extend(FORMAT_VERSION.to_be_bytes());
    let mut records = 0;
    // BTreeMap order puts every parent before its children.
    for (path, node) in nodes.iter().filter(|(p, n)| p.as_str() != "/" && n.stat.ephemeral_owner == 0) {
        let create = JournalRecord {
            op: OP_CREATE,
            path: path.clone(),
            version: node.next_sequence,
            time_ms: node.stat.ctime_ms,
            data: node.data.clone(),
        };
        out.extend(encode_record(&create));
        records += 1;
        if node.stat.version != 0 {
            let set = JournalRecord {
                op: OP_SET,
                path: path.clone(),
                version: node.stat.version,
                time_ms: node.stat.mtime_ms,
                data: node.data.clone(),
            };
            out.extend(encode_record(&set));
            records += 1;
        }
    }
    // Opened for appending: after the rename this handle is the journal's.
    let written = OpenOptions::new().append(true).create(true).open(&tmp).and_then(|mut file| {
        file.set_len(0)?;
        file.write_all(&out)?;
        file.sync_all()?;
        Ok(file)
    });
    let journal = match written {
        Ok(file) => file,
        Err(e) => {
            // Its blocks are what a full disk needs back first.
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
    };
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    let snapshot = Snapshot { journal, len: out.len() as u64, records };
    match sync_parent(path) {
        Ok(()) => Ok(snapshot),
        Err(source) => Err(SnapshotError::DirSync { snapshot, source }),
    }
}

/// Fsyncs the directory holding `path`, so a rename into it survives a crash.
fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir).and_then(|d| d.sync_all()),
        None => Ok(()),
    }
}

/// How a journal file starts.
#[derive(Debug, PartialEq, Eq)]
enum Header {
    /// No bytes, or a header that a crash cut short (nothing was ever appended after it).
    Empty,
    /// [`MAGIC`] and this format version.
    Versioned(u16),
    /// Format 1: records from byte 0.
    Unversioned,
}

fn header(bytes: &[u8]) -> Header {
    if bytes.len() < HEADER_LEN && (MAGIC.starts_with(bytes) || bytes.starts_with(&MAGIC)) {
        return Header::Empty;
    }
    match bytes.get(..HEADER_LEN) {
        Some(h) if h.starts_with(&MAGIC) => Header::Versioned(u16::from_be_bytes([h[6], h[7]])),
        _ => Header::Unversioned,
    }
}

/// Why a replay stopped short of the end.
#[derive(Debug)]
enum ReplayError<E> {
    /// The record at `offset` is damaged, and a valid one starts at `next_valid`.
    Damaged { offset: usize, next_valid: usize },
    /// `apply` refused a record.
    Apply(E),
}

/// Walks the records of `bytes` from `start`, handing each (with its byte offset) to
/// `apply`. Stops at the first damaged record: when a valid record starts anywhere
/// after it, that is corruption in the middle ([`ReplayError::Damaged`]); otherwise it
/// is a torn tail, reported in [`Replayed::torn`].
fn replay<E>(
    bytes: &[u8],
    start: usize,
    format: Format,
    mut apply: impl FnMut(usize, &JournalRecord) -> std::result::Result<(), E>,
) -> std::result::Result<Replayed, ReplayError<E>> {
    let mut at = start;
    let mut records = 0;
    while at < bytes.len() {
        match decode_record(&bytes[at..], format) {
            Some((record, len)) => {
                apply(at, &record).map_err(ReplayError::Apply)?;
                at += len;
                records += 1;
            }
            None => {
                if let Some(next_valid) = next_valid_record(bytes, at + 1, format) {
                    return Err(ReplayError::Damaged { offset: at, next_valid });
                }
                return Ok(Replayed { end: at, records, torn: bytes.len() - at });
            }
        }
    }
    Ok(Replayed { end: at, records, torn: 0 })
}

/// The first offset from `from` on where a whole, valid record starts. Only damaged
/// journals are searched: a torn tail is at most one record long, and candidates whose
/// length runs past the end are skipped without checksumming.
fn next_valid_record(bytes: &[u8], from: usize, format: Format) -> Option<usize> {
    (from..bytes.len().saturating_sub(FRAME_LEN)).find(|&at| decode_record(&bytes[at..], format).is_some())
}

fn encode_record(r: &JournalRecord) -> Vec<u8> {
    let payload_len = 19 + r.path.len() + r.data.len();
    let mut out = Vec::with_capacity(FRAME_LEN + payload_len);
    out.extend((payload_len as u32).to_be_bytes());
    out.extend([0; 4]); // the CRC, once the payload is in
    out.push(r.op);
    out.extend((r.path.len() as u16).to_be_bytes());
    out.extend(r.path.as_bytes());
    out.extend(r.version.to_be_bytes());
    out.extend(r.time_ms.to_be_bytes());
    out.extend((r.data.len() as u32).to_be_bytes());
    out.extend(&r.data);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[..4]), &out[FRAME_LEN..]);
    out[4..8].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Decodes the record at the start of `buf`: `(record, bytes used)`, or `None` when
/// it is cut short, fails its CRC or does not decode.
fn decode_record(buf: &[u8], format: Format) -> Option<(JournalRecord, usize)> {
    let len_bytes = buf.get(0..4)?;
    let len = u32::from_be_bytes(len_bytes.try_into().ok()?) as usize;
    let crc = u32::from_be_bytes(buf.get(4..8)?.try_into().ok()?);
    let payload = buf.get(FRAME_LEN..FRAME_LEN.checked_add(len)?)?;
    let expected = match format {
        Format::V1 => crc32c::crc32c(payload),
        Format::V2 => crc32c::crc32c_append(crc32c::crc32c(len_bytes), payload),
    };
    if expected != crc {
        return None;
    }
    let op = *payload.first()?;
    if !matches!(op, OP_CREATE | OP_SET | OP_DELETE) {
        return None;
    }
    let path_len = u16::from_be_bytes(payload.get(1..3)?.try_into().ok()?) as usize;
    let path = std::str::from_utf8(payload.get(3..3 + path_len)?).ok()?.to_string();
    let mut at = 3 + path_len;
    let version = i32::from_be_bytes(payload.get(at..at + 4)?.try_into().ok()?);
    at += 4;
    let time_ms = i64::from_be_bytes(payload.get(at..at + 8)?.try_into().ok()?);
    at += 8;
    let data_len = u32::from_be_bytes(payload.get(at..at + 4)?.try_into().ok()?) as usize;
    at += 4;
    let data = payload.get(at..at.checked_add(data_len)?)?.to_vec();
    if at + data_len != payload.len() {
        return None;
    }
    Some((JournalRecord { op, path, version, time_ms, data }, FRAME_LEN + len))
}

#[async_trait::async_trait]
impl MetadataStore for EmbeddedStore {
    async fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<String> {
        validate_path(path)?;
        if path == "/" {
            return Err(Error::NodeExists { path: path.into() });
        }
        let mut state = self.lock();
        let (parent, name) = split(path);
        let parent_node = state.nodes.get(parent).ok_or_else(|| Error::NoNode { path: parent.into() })?;
        if parent_node.stat.ephemeral_owner != 0 {
            return Err(Error::NoChildrenForEphemerals { path: path.into() });
        }
        let (name, next_sequence) = if mode.is_sequential() {
            (format!("{name}{:010}", parent_node.next_sequence), parent_node.next_sequence + 1)
        } else {
            (name.to_string(), parent_node.next_sequence)
        };
        let full = join(parent, &name);
        if state.nodes.contains_key(&full) {
            return Err(Error::NodeExists { path: full });
        }
        let now = now_ms();
        if !mode.is_ephemeral() {
            state.journal(JournalRecord { op: OP_CREATE, path: full.clone(), version: 0, time_ms: now, data: data.to_vec() })?;
        }
        let owner = if mode.is_ephemeral() { self.session_id } else { 0 };
        state.nodes.insert(full.clone(), Node::new(data.to_vec(), now, owner));
        let parent_node = state.nodes.get_mut(parent).expect("invariant: parent checked above under the same lock");
        parent_node.children.insert(name);
        parent_node.stat.cversion += 1;
        parent_node.next_sequence = next_sequence;
        state.maybe_compact();
        State::fire(&mut state.data_watches, &full, WatchEvent::Created);
        State::fire(&mut state.child_watches, parent, WatchEvent::ChildrenChanged);
        Ok(full)
    }

    async fn get(&self, path: &str) -> Result<Option<(Vec<u8>, Stat)>> {
        validate_path(path)?;
        Ok(self.lock().nodes.get(path).map(|n| (n.data.clone(), n.stat())))
    }

    async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        validate_path(path)?;
        Ok(self.lock().nodes.get(path).map(Node::stat))
    }

    async fn set(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<Stat> {
        validate_path(path)?;
        let mut state = self.lock();
        let node = state.nodes.get(path).ok_or_else(|| Error::NoNode { path: path.into() })?;
        let actual = node.stat.version;
        if let Some(expected) = expected_version.filter(|&v| v != actual) {
            return Err(Error::BadVersion { path: path.into(), expected, actual });
        }
        let ephemeral = node.stat.ephemeral_owner != 0;
        let now = now_ms();
        if !ephemeral {
            let record = JournalRecord { op: OP_SET, path: path.into(), version: actual + 1, time_ms: now, data: data.to_vec() };
            state.journal(record)?;
        }
        let node = state.nodes.get_mut(path).expect("invariant: checked above under the same lock");
        node.data = data.to_vec();
        node.stat.version = actual + 1;
        node.stat.mtime_ms = now;
        let stat = node.stat();
        state.maybe_compact();
        State::fire(&mut state.data_watches, path, WatchEvent::DataChanged);
        Ok(stat)
    }

    async fn delete(&self, path: &str, expected_version: Option<i32>) -> Result<()> {
        validate_path(path)?;
        let mut state = self.lock();
        let node = state.nodes.get(path).ok_or_else(|| Error::NoNode { path: path.into() })?;
        if path == "/" || !node.children.is_empty() {
            return Err(Error::NotEmpty { path: path.into() });
        }
        let actual = node.stat.version;
        if let Some(expected) = expected_version.filter(|&v| v != actual) {
            return Err(Error::BadVersion { path: path.into(), expected, actual });
        }
        if node.stat.ephemeral_owner == 0 {
            state.journal(JournalRecord { op: OP_DELETE, path: path.into(), version: 0, time_ms: now_ms(), data: Vec::new() })?;
        }
        state.remove(path);
        state.maybe_compact();
        Ok(())
    }

    async fn children(&self, path: &str) -> Result<Vec<String>> {
        validate_path(path)?;
        let state = self.lock();
        let node = state.nodes.get(path).ok_or_else(|| Error::NoNode { path: path.into() })?;
        Ok(node.children.iter().cloned().collect())
    }

    async fn watch_data(&self, path: &str) -> Result<(Option<(Vec<u8>, Stat)>, Watch)> {
        validate_path(path)?;
        let mut state = self.lock();
        let current = state.nodes.get(path).map(|n| (n.data.clone(), n.stat()));
        let (tx, rx) = oneshot::channel();
        state.data_watches.entry(path.to_string()).or_default().push(tx);
        Ok((current, Watch::new(rx)))
    }

    async fn watch_children(&self, path: &str) -> Result<(Vec<String>, Watch)> {
        validate_path(path)?;
        let mut state = self.lock();
        let node = state.nodes.get(path).ok_or_else(|| Error::NoNode { path: path.into() })?;
        let children = node.children.iter().cloned().collect();
        let (tx, rx) = oneshot::channel();
        state.child_watches.entry(path.to_string()).or_default().push(tx);
        Ok((children, Watch::new(rx)))
    }

    fn session_id(&self) -> i64 {
        self.session_id
    }
}

#[cfg(test)]
mod tests;
