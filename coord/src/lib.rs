//! Fjord's metadata store: a ZooKeeper-shaped tree of znodes behind one trait, with
//! two backends, so standalone mode and cluster mode run the same broker code.
//!
//! # Layout
//! - [`MetadataStore`] (this file): the operations brokers and services use, with
//!   ZooKeeper's semantics: persistent / ephemeral / sequential nodes, versions for
//!   compare-and-set, one-shot data and child watches.
//! - [`embedded`]: a single-process store, durable in a journal under the data
//!   directory; its one session ends with the process, taking ephemerals with it.
//! - [`paths`]: the registry paths of docs/architecture.md (relative to the chroot).
//! - [`registry`]: the JSON documents stored at those paths.
//!
//! # Invariants
//! A path is absolute, has no empty, `.` or `..` component and no trailing slash. A
//! node's `version` grows by one on every `set`; `set`/`delete` with an expected
//! version succeed only when it matches, which is what makes leader and ISR changes
//! safe against stale writers.

pub mod embedded;
pub mod paths;
pub mod registry;
pub mod zookeeper;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

pub use embedded::EmbeddedStore;
pub use zookeeper::ZooKeeperStore;

/// How a node lives and is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    /// Lives until deleted.
    Persistent,
    /// Deleted when the creating session ends.
    Ephemeral,
    /// Persistent, with a monotonically increasing 10-digit suffix appended to the name.
    PersistentSequential,
    /// Ephemeral and sequential.
    EphemeralSequential,
}

impl CreateMode {
    /// Whether the node ends with its session.
    pub fn is_ephemeral(self) -> bool {
        matches!(self, Self::Ephemeral | Self::EphemeralSequential)
    }

    /// Whether a sequence suffix is appended.
    pub fn is_sequential(self) -> bool {
        matches!(self, Self::PersistentSequential | Self::EphemeralSequential)
    }
}

/// Metadata of a node, as ZooKeeper reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    /// Number of changes to the data; the compare-and-set token.
    pub version: i32,
    /// Number of changes to the children.
    pub cversion: i32,
    /// Owning session of an ephemeral node, 0 otherwise.
    pub ephemeral_owner: i64,
    /// Number of children.
    pub num_children: i32,
    /// Creation time, ms since the epoch.
    pub ctime_ms: i64,
    /// Last modification time, ms since the epoch.
    pub mtime_ms: i64,
}

/// What a one-shot watch saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEvent {
    /// The watched node was created.
    Created,
    /// The watched node was deleted.
    Deleted,
    /// The watched node's data changed.
    DataChanged,
    /// A child was added or removed.
    ChildrenChanged,
    /// The session ended before anything happened: re-read everything.
    SessionLost,
}

/// A one-shot watch: resolves once, with the first event on the node.
#[derive(Debug)]
pub struct Watch(tokio::sync::oneshot::Receiver<WatchEvent>);

impl Watch {
    /// Wraps the receiving end of a watch registration.
    pub fn new(receiver: tokio::sync::oneshot::Receiver<WatchEvent>) -> Self {
        Self(receiver)
    }
}

impl Future for Watch {
    type Output = WatchEvent;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<WatchEvent> {
        // A dropped sender means the store (and so the session) is gone.
        Pin::new(&mut self.0).poll(cx).map(|r| r.unwrap_or(WatchEvent::SessionLost))
    }
}

/// The metadata store: ZooKeeper's data model and guarantees.
#[async_trait::async_trait]
pub trait MetadataStore: Send + Sync + 'static {
    /// Creates a node; its parent must exist. Returns the created path, which for a
    /// sequential node carries the suffix.
    async fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<String>;
    /// Data and stat of a node, `None` when it does not exist.
    async fn get(&self, path: &str) -> Result<Option<(Vec<u8>, Stat)>>;
    /// Stat of a node, `None` when it does not exist.
    async fn exists(&self, path: &str) -> Result<Option<Stat>>;
    /// Replaces the data; with `Some(version)` only if the node is at that version.
    async fn set(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<Stat>;
    /// Deletes a node without children; with `Some(version)` only at that version.
    async fn delete(&self, path: &str, expected_version: Option<i32>) -> Result<()>;
    /// Names of the children, sorted. [`Error::NoNode`] when the node is missing.
    async fn children(&self, path: &str) -> Result<Vec<String>>;
    /// Reads a node (or its absence) and leaves a one-shot watch for its next
    /// creation, change or deletion.
    async fn watch_data(&self, path: &str) -> Result<(Option<(Vec<u8>, Stat)>, Watch)>;
    /// Lists children and leaves a one-shot watch for the next change to the list
    /// (or the node's deletion).
    async fn watch_children(&self, path: &str) -> Result<(Vec<String>, Watch)>;
    /// Identifier of this store handle's session (owner of its ephemeral nodes).
    fn session_id(&self) -> i64;
}

/// A shared handle on a metadata store.
pub type Store = Arc<dyn MetadataStore>;

/// Opens the store: ZooKeeper when `zookeeper_connect` is given
/// (`host:port[,host:port...][/chroot]`, as Kafka's `zookeeper.connect`), otherwise the
/// embedded store under `data_dir`.
pub async fn open(zookeeper_connect: Option<&str>, data_dir: &Path) -> Result<Store> {
    Ok(match zookeeper_connect {
        Some(connect) => Arc::new(ZooKeeperStore::connect(connect, zookeeper::DEFAULT_SESSION_TIMEOUT).await?),
        None => Arc::new(EmbeddedStore::open(data_dir)?),
    })
}

/// Creates `path` and any missing parents (parents persistent and empty). A node
/// that already exists at `path` is an error ([`Error::NodeExists`]); parents that
/// exist are fine.
pub async fn create_all(store: &dyn MetadataStore, path: &str, data: &[u8], mode: CreateMode) -> Result<String> {
    validate_path(path)?;
    let mut parent = String::new();
    let components: Vec<&str> = path[1..].split('/').collect();
    for component in &components[..components.len() - 1] {
        parent.push('/');
        parent.push_str(component);
        match store.create(&parent, &[], CreateMode::Persistent).await {
            Ok(_) | Err(Error::NodeExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    store.create(path, data, mode).await
}

/// Deletes `path` and everything below it. A missing node is not an error.
pub async fn delete_all(store: &dyn MetadataStore, path: &str) -> Result<()> {
    let mut stack = vec![path.to_string()];
    let mut order = Vec::new();
    while let Some(node) = stack.pop() {
        match store.children(&node).await {
            Ok(children) => stack.extend(children.iter().map(|c| join(&node, c))),
            Err(Error::NoNode { .. }) => continue,
            Err(e) => return Err(e),
        }
        order.push(node);
    }
    for node in order.iter().rev() {
        match store.delete(node, None).await {
            Ok(()) | Err(Error::NoNode { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `parent` + `/` + `child`, without doubling the slash under the root.
pub fn join(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// Checks ZooKeeper's path rules.
pub fn validate_path(path: &str) -> Result<()> {
    let invalid = |reason| Err(Error::InvalidPath { path: path.to_string(), reason });
    if !path.starts_with('/') {
        return invalid("must start with '/'");
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return invalid("must not end with '/'");
    }
    for component in path[1..].split('/') {
        match component {
            "" => return invalid("empty component"),
            "." | ".." => return invalid("relative component"),
            c if c.chars().any(|ch| ch == '\0' || ch.is_control()) => return invalid("control character"),
            _ => {}
        }
    }
    Ok(())
}

/// What can go wrong talking to the metadata store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The node (or, for create, its parent) does not exist.
    #[error("no node at {path}")]
    NoNode {
        /// Path that was missing.
        path: String,
    },
    /// A node already exists at the path.
    #[error("a node already exists at {path}")]
    NodeExists {
        /// Path that exists.
        path: String,
    },
    /// The expected version did not match: someone else changed the node first.
    #[error("version mismatch at {path}: expected {expected}, found {actual}")]
    BadVersion {
        /// Node path.
        path: String,
        /// Version the caller expected.
        expected: i32,
        /// Version the node has.
        actual: i32,
    },
    /// Delete of a node that has children.
    #[error("{path} has children")]
    NotEmpty {
        /// Node path.
        path: String,
    },
    /// Ephemeral nodes cannot have children.
    #[error("{path}: ephemeral nodes cannot have children")]
    NoChildrenForEphemerals {
        /// Path of the child that was refused.
        path: String,
    },
    /// The path breaks ZooKeeper's rules.
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath {
        /// The path.
        path: String,
        /// Which rule.
        reason: &'static str,
    },
    /// The session expired: ephemerals are gone and watches lost; re-register.
    #[error("metadata store session expired")]
    SessionExpired,
    /// The connection to the store was lost; the operation may or may not have applied.
    #[error("connection to the metadata store lost")]
    ConnectionLoss,
    /// A ZooKeeper error without a more specific variant.
    #[error("zookeeper: {0}")]
    ZooKeeper(String),
    /// Reading or writing the embedded store's files failed.
    #[error("metadata store I/O on {path}: {source}")]
    Io {
        /// File involved.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Another store (another process) has the embedded store's directory open.
    #[error("the metadata store in {path} is in use by another process (a running broker?)")]
    InUse {
        /// The store's directory.
        path: PathBuf,
    },
    /// The embedded store's files are damaged beyond the torn tail it repairs itself.
    #[error("metadata store file {path} is corrupt: {detail}")]
    Corrupt {
        /// File involved.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A record in the middle of the embedded store's journal is damaged: valid records
    /// follow it, so it is no torn tail, and neither skipping it nor cutting the journal
    /// there would be safe. The store refuses to open and leaves the file as it is.
    #[error(
        "metadata journal {} is damaged at byte offset {offset}: the record there fails its checksum, yet a valid record \
         follows at byte offset {next_valid}; refusing to start rather than lose or misapply the changes after it. \
         Restore the file from a backup, or, if bytes {offset}..{next_valid} are a write that failed (a full disk under \
         an older Fjord), cut out exactly those bytes",
        path.display()
    )]
    CorruptJournal {
        /// The journal file.
        path: PathBuf,
        /// Byte offset of the damaged record.
        offset: u64,
        /// Byte offset of the first valid record after it.
        next_valid: u64,
    },
    /// A registry document is not the JSON it should be.
    #[error("bad registry document at {path}: {source}")]
    Codec {
        /// Node path.
        path: String,
        /// Parser error.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// The store as a whole cannot be reached (connection or session lost): one outage
    /// for every caller, which the store itself reports; a caller that retries need not
    /// log each attempt.
    pub fn is_store_unreachable(&self) -> bool {
        matches!(self, Error::ConnectionLoss | Error::SessionExpired)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_rules() {
        for good in ["/", "/a", "/a/b-1/c_2", "/brokers/topics/t.x"] {
            validate_path(good).unwrap();
        }
        for bad in ["", "a", "/a/", "//a", "/a//b", "/a/./b", "/a/../b", "/a\0b"] {
            assert!(validate_path(bad).is_err(), "{bad:?} accepted");
        }
    }
}
