//! The embedded single-node store: the whole tree in memory, every change to a
//! persistent node appended to a journal file and fsynced before the call returns.
//!
//! # Journal format
//! `metadata.journal` under the store's directory is a sequence of records:
//!
//! ```text
//! length u32 BE | crc32c u32 BE (of the payload) | payload
//! payload: op u8 (1 create, 2 set, 3 delete) | path len u16 | path | version i32 |
//!          time_ms i64 | data len u32 | data
//! ```
//!
//! Opening replays it. A torn or corrupt tail (a crash mid-write) is cut off with a
//! warning: every earlier record was fsynced before its call returned, so nothing
//! acknowledged is lost. When the journal holds many more records than live nodes it
//! is rewritten as one create per node (into a temporary file, fsynced, renamed).
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
const OP_CREATE: u8 = 1;
const OP_SET: u8 = 2;
const OP_DELETE: u8 = 3;
/// Rewrite the journal when it holds this many more records than there are nodes.
const COMPACT_SLACK: usize = 10_000;

/// A single-process metadata store, durable under a directory.
#[derive(Debug)]
pub struct EmbeddedStore {
    state: Mutex<State>,
    session_id: i64,
}

#[derive(Debug)]
struct State {
    nodes: BTreeMap<String, Node>,
    data_watches: HashMap<String, Vec<oneshot::Sender<WatchEvent>>>,
    child_watches: HashMap<String, Vec<oneshot::Sender<WatchEvent>>>,
    journal: File,
    journal_path: PathBuf,
    journal_records: usize,
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

struct JournalRecord {
    op: u8,
    path: String,
    version: i32,
    time_ms: i64,
    data: Vec<u8>,
}

impl EmbeddedStore {
    /// Opens (or creates) the store in `dir`, replaying its journal.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
        let journal_path = dir.join(JOURNAL);
        let io = |source| Error::Io { path: journal_path.clone(), source };
        let mut nodes = BTreeMap::new();
        nodes.insert("/".to_string(), Node::new(Vec::new(), 0, 0));
        let mut records = 0;
        let mut valid_len = 0u64;
        if journal_path.exists() {
            let mut bytes = Vec::new();
            File::open(&journal_path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(io)?;
            let mut at = 0usize;
            while at < bytes.len() {
                let Some((record, len)) = decode_record(&bytes[at..]) else {
                    tracing::warn!(
                        path = %journal_path.display(),
                        offset = at,
                        dropped = bytes.len() - at,
                        "metadata journal has a torn or corrupt tail; cutting it off"
                    );
                    break;
                };
                apply(&mut nodes, &record).map_err(|detail| Error::Corrupt { path: journal_path.clone(), detail })?;
                at += len;
                records += 1;
            }
            valid_len = at as u64;
        }
        let journal = OpenOptions::new().create(true).append(true).open(&journal_path).map_err(io)?;
        if journal.metadata().map_err(io)?.len() != valid_len {
            journal.set_len(valid_len).map_err(io)?;
            journal.sync_all().map_err(io)?;
        }
        let session_id = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(1);
        Ok(Self {
            state: Mutex::new(State {
                nodes,
                data_watches: HashMap::new(),
                child_watches: HashMap::new(),
                journal,
                journal_path,
                journal_records: records,
            }),
            session_id,
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
    fn journal(&mut self, record: JournalRecord) -> Result<()> {
        let bytes = encode_record(&record);
        let io = |source| Error::Io { path: self.journal_path.clone(), source };
        self.journal.write_all(&bytes).map_err(io)?;
        self.journal.sync_data().map_err(io)?;
        self.journal_records += 1;
        if self.journal_records > self.nodes.len() + COMPACT_SLACK {
            self.compact()?;
        }
        Ok(())
    }

    /// Rewrites the journal as one create (plus one set, to keep the version) per
    /// persistent node, parents first.
    fn compact(&mut self) -> Result<()> {
        let tmp = self.journal_path.with_extension("journal.tmp");
        let io = |source| Error::Io { path: tmp.clone(), source };
        let mut out = Vec::new();
        let mut count = 0;
        // BTreeMap order puts every parent before its children.
        for (path, node) in self.nodes.iter().filter(|(p, n)| p.as_str() != "/" && n.stat.ephemeral_owner == 0) {
            let create = JournalRecord {
                op: OP_CREATE,
                path: path.clone(),
                version: node.next_sequence,
                time_ms: node.stat.ctime_ms,
                data: node.data.clone(),
            };
            out.extend(encode_record(&create));
            count += 1;
            if node.stat.version != 0 {
                let set = JournalRecord {
                    op: OP_SET,
                    path: path.clone(),
                    version: node.stat.version,
                    time_ms: node.stat.mtime_ms,
                    data: node.data.clone(),
                };
                out.extend(encode_record(&set));
                count += 1;
            }
        }
        let mut file = File::create(&tmp).map_err(io)?;
        file.write_all(&out).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &self.journal_path).map_err(io)?;
        if let Some(dir) = self.journal_path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        self.journal = OpenOptions::new().append(true).open(&self.journal_path).map_err(io)?;
        self.journal_records = count;
        Ok(())
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

fn encode_record(r: &JournalRecord) -> Vec<u8> {
    let mut payload = Vec::with_capacity(19 + r.path.len() + r.data.len());
    payload.push(r.op);
    payload.extend((r.path.len() as u16).to_be_bytes());
    payload.extend(r.path.as_bytes());
    payload.extend(r.version.to_be_bytes());
    payload.extend(r.time_ms.to_be_bytes());
    payload.extend((r.data.len() as u32).to_be_bytes());
    payload.extend(&r.data);
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend((payload.len() as u32).to_be_bytes());
    out.extend(crc32c::crc32c(&payload).to_be_bytes());
    out.extend(payload);
    out
}

/// Decodes the record at the start of `buf`: `(record, bytes used)`, or `None` when
/// it is torn or fails its CRC.
fn decode_record(buf: &[u8]) -> Option<(JournalRecord, usize)> {
    let len = u32::from_be_bytes(buf.get(0..4)?.try_into().ok()?) as usize;
    let crc = u32::from_be_bytes(buf.get(4..8)?.try_into().ok()?);
    let payload = buf.get(8..8usize.checked_add(len)?)?;
    if crc32c::crc32c(payload) != crc {
        return None;
    }
    let op = *payload.first()?;
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
    Some((JournalRecord { op, path, version, time_ms, data }, 8 + len))
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
mod tests {
    use super::*;
    use crate::{create_all, delete_all};

    fn store(dir: &Path) -> EmbeddedStore {
        EmbeddedStore::open(dir).unwrap()
    }

    #[tokio::test]
    async fn create_get_set_delete_with_versions() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        assert!(matches!(s.create("/a/b", b"x", CreateMode::Persistent).await, Err(Error::NoNode { .. })));
        s.create("/a", b"", CreateMode::Persistent).await.unwrap();
        s.create("/a/b", b"x", CreateMode::Persistent).await.unwrap();
        assert!(matches!(s.create("/a/b", b"y", CreateMode::Persistent).await, Err(Error::NodeExists { .. })));
        let (data, stat) = s.get("/a/b").await.unwrap().unwrap();
        assert_eq!((data.as_slice(), stat.version), (&b"x"[..], 0));
        assert_eq!(s.set("/a/b", b"y", Some(0)).await.unwrap().version, 1);
        assert!(matches!(s.set("/a/b", b"z", Some(0)).await, Err(Error::BadVersion { expected: 0, actual: 1, .. })));
        assert!(matches!(s.delete("/a", None).await, Err(Error::NotEmpty { .. })));
        assert!(matches!(s.delete("/a/b", Some(0)).await, Err(Error::BadVersion { .. })));
        s.delete("/a/b", Some(1)).await.unwrap();
        assert_eq!(s.get("/a/b").await.unwrap(), None);
        assert_eq!(s.children("/a").await.unwrap(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn persistent_nodes_survive_reopen_and_ephemerals_do_not() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = store(dir.path());
            create_all(&s, "/brokers/topics/t", b"{}", CreateMode::Persistent).await.unwrap();
            s.set("/brokers/topics/t", b"{\"v\":2}", None).await.unwrap();
            create_all(&s, "/brokers/ids/1", b"e", CreateMode::Ephemeral).await.unwrap();
            let seq = s.create("/brokers/s-", b"", CreateMode::PersistentSequential).await.unwrap();
            assert_eq!(seq, "/brokers/s-0000000000");
        }
        let s = store(dir.path());
        let (data, stat) = s.get("/brokers/topics/t").await.unwrap().unwrap();
        assert_eq!((data.as_slice(), stat.version), (&b"{\"v\":2}"[..], 1));
        assert_eq!(s.get("/brokers/ids/1").await.unwrap(), None);
        let seq = s.create("/brokers/s-", b"", CreateMode::PersistentSequential).await.unwrap();
        assert_eq!(seq, "/brokers/s-0000000001", "sequence numbers are never reused");
    }

    #[tokio::test]
    async fn a_torn_journal_tail_is_cut_and_earlier_changes_kept() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = store(dir.path());
            for i in 0..5 {
                s.create(&format!("/n{i}"), b"data", CreateMode::Persistent).await.unwrap();
            }
        }
        let journal = dir.path().join(JOURNAL);
        let full = std::fs::read(&journal).unwrap();
        let record_len = full.len() / 5;
        for cut in 1..record_len {
            std::fs::write(&journal, &full[..full.len() - cut]).unwrap();
            let s = store(dir.path());
            assert_eq!(s.children("/").await.unwrap(), vec!["n0", "n1", "n2", "n3"], "cut {cut}");
            drop(s);
        }
        // Appends after a repair land after the cut, not after the garbage.
        std::fs::write(&journal, &full[..full.len() - 3]).unwrap();
        store(dir.path()).create("/n9", b"", CreateMode::Persistent).await.unwrap();
        assert_eq!(store(dir.path()).children("/").await.unwrap(), vec!["n0", "n1", "n2", "n3", "n9"]);
    }

    #[tokio::test]
    async fn watches_fire_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let (none, created) = s.watch_data("/w").await.unwrap();
        assert!(none.is_none());
        s.create("/w", b"1", CreateMode::Persistent).await.unwrap();
        assert_eq!(created.await, WatchEvent::Created);
        let (_, changed) = s.watch_data("/w").await.unwrap();
        let (_, children) = s.watch_children("/").await.unwrap();
        s.set("/w", b"2", None).await.unwrap();
        assert_eq!(changed.await, WatchEvent::DataChanged);
        s.create("/v", b"", CreateMode::Ephemeral).await.unwrap();
        assert_eq!(children.await, WatchEvent::ChildrenChanged);
        let (_, deleted) = s.watch_data("/v").await.unwrap();
        s.close_session();
        assert_eq!(deleted.await, WatchEvent::Deleted);
    }

    #[tokio::test]
    async fn compaction_keeps_the_tree_and_versions() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = store(dir.path());
            s.create("/c", b"", CreateMode::Persistent).await.unwrap();
            for i in 0..(COMPACT_SLACK + 10) {
                s.set("/c", format!("{i}").as_bytes(), None).await.unwrap();
            }
            assert!(s.lock().journal_records < 100, "journal was compacted");
        }
        let s = store(dir.path());
        let (data, stat) = s.get("/c").await.unwrap().unwrap();
        assert_eq!(data, format!("{}", COMPACT_SLACK + 9).into_bytes());
        assert_eq!(stat.version, (COMPACT_SLACK + 10) as i32);
        delete_all(&s, "/c").await.unwrap();
        assert_eq!(s.get("/c").await.unwrap(), None);
    }

    #[tokio::test]
    async fn ephemerals_cannot_have_children() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        s.create("/e", b"", CreateMode::Ephemeral).await.unwrap();
        assert!(matches!(s.create("/e/x", b"", CreateMode::Persistent).await, Err(Error::NoChildrenForEphemerals { .. })));
    }
}
