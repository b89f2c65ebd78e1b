//! The destination filesystem: the few operations the commit protocol needs, so HDFS and a
//! local directory behave the same.
//!
//! Paths are absolute, `/`-separated, inside the backend's namespace. Semantics every
//! backend keeps (checked by [`conformance`]):
//! - `create` makes missing parents and fails with [`Error::AlreadyExists`] on an existing
//!   path; the data is durable and visible under the name once [`FileWriter::close`] returns.
//! - `rename` never replaces: an existing target is [`Error::AlreadyExists`], a missing
//!   source [`Error::NotFound`]; the target's parent must exist. It is atomic.
//! - `mkdirs` is idempotent; `delete` of a missing path returns `false`.
//! - `list` returns a directory's entries sorted by name; a missing directory is
//!   [`Error::NotFound`].

pub mod hdfs;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::AsyncWriteExt;

use crate::{Error, Result};

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Last path component.
    pub name: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Length in bytes (0 for directories).
    pub len: u64,
}

/// A file being written.
#[async_trait]
pub trait FileWriter: Send {
    /// Appends bytes.
    async fn write(&mut self, data: Bytes) -> Result<()>;
    /// Makes the file durable and complete; the writer is done.
    async fn close(self: Box<Self>) -> Result<()>;
}

/// A destination filesystem.
#[async_trait]
pub trait FileSystem: Send + Sync {
    /// Creates a new file (and missing parents) for writing.
    async fn create(&self, path: &str) -> Result<Box<dyn FileWriter>>;
    /// Renames `from` to `to` atomically, never replacing `to`.
    async fn rename(&self, from: &str, to: &str) -> Result<()>;
    /// Entries of a directory, sorted by name.
    async fn list(&self, dir: &str) -> Result<Vec<Entry>>;
    /// Creates a directory and its parents; an existing one is fine.
    async fn mkdirs(&self, dir: &str) -> Result<()>;
    /// Deletes a file, or a directory (with `recursive` when it is not empty). Returns
    /// whether something was there.
    async fn delete(&self, path: &str, recursive: bool) -> Result<bool>;
    /// The whole content of a (small) file.
    async fn read(&self, path: &str) -> Result<Vec<u8>>;
    /// Whether the path exists.
    async fn exists(&self, path: &str) -> Result<bool>;
}

/// A destination: the filesystem and the root directory inside it.
#[derive(Clone)]
pub struct Destination {
    /// The backend.
    pub fs: Arc<dyn FileSystem>,
    /// Absolute root path inside the backend, without a trailing `/` (empty for `/`).
    pub root: String,
}

impl Destination {
    /// The absolute path of `rel` (a `/`-separated path under the root).
    pub fn path(&self, rel: &str) -> String {
        format!("{}/{}", self.root, rel.trim_start_matches('/'))
    }
}

/// Opens `file:///path` (local) or `hdfs://host:port/path` with the given bound on every
/// HDFS call.
pub fn open(url: &str, hdfs_timeout: std::time::Duration) -> Result<Destination> {
    let bad = |reason| Error::BadUrl { url: url.to_string(), reason };
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(bad("a file URL needs an absolute path: file:///dir"));
        }
        return Ok(Destination { fs: Arc::new(LocalFs), root: normalize(path) });
    }
    if let Some(rest) = url.strip_prefix("hdfs://") {
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() {
            return Err(bad("an HDFS URL needs a namenode: hdfs://host:port/path"));
        }
        let fs = hdfs::HdfsFs::connect(authority, hdfs_timeout)?;
        return Ok(Destination { fs: Arc::new(fs), root: normalize(path) });
    }
    Err(bad("the scheme must be file:// or hdfs://"))
}

fn normalize(path: &str) -> String {
    let mut out = String::new();
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        out.push('/');
        out.push_str(part);
    }
    out
}

/// The local filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalFs;

fn io<'a>(op: &'static str, path: &'a str) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| match source.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound(path.to_string()),
        std::io::ErrorKind::AlreadyExists => Error::AlreadyExists(path.to_string()),
        _ => Error::Io { op, path: path.to_string(), source },
    }
}

struct LocalWriter {
    path: String,
    file: tokio::fs::File,
}

#[async_trait]
impl FileWriter for LocalWriter {
    async fn write(&mut self, data: Bytes) -> Result<()> {
        self.file.write_all(&data).await.map_err(io("write", &self.path))
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        self.file.flush().await.map_err(io("flush", &self.path))?;
        // Durable before it can be renamed into the final layout.
        self.file.sync_all().await.map_err(io("sync", &self.path))
    }
}

#[async_trait]
impl FileSystem for LocalFs {
    async fn create(&self, path: &str) -> Result<Box<dyn FileWriter>> {
        if let Some(parent) = PathBuf::from(path).parent() {
            tokio::fs::create_dir_all(parent).await.map_err(io("mkdirs", path))?;
        }
        let file = tokio::fs::OpenOptions::new().write(true).create_new(true).open(path).await.map_err(io("create", path))?;
        Ok(Box::new(LocalWriter { path: path.to_string(), file }))
    }

    async fn rename(&self, from: &str, to: &str) -> Result<()> {
        // rename(2) replaces; the check makes "never replace" hold for a single writer,
        // which is what the loader is (one run per job).
        if tokio::fs::symlink_metadata(to).await.is_ok() {
            return Err(Error::AlreadyExists(to.to_string()));
        }
        tokio::fs::rename(from, to).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound && std::path::Path::new(from).exists() {
                Error::NotFound(parent_of(to).to_string())
            } else {
                io("rename", from)(e)
            }
        })
    }

    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let mut read = tokio::fs::read_dir(dir).await.map_err(io("list", dir))?;
        let mut out = Vec::new();
        while let Some(e) = read.next_entry().await.map_err(io("list", dir))? {
            let meta = e.metadata().await.map_err(io("stat", dir))?;
            out.push(Entry {
                name: e.file_name().to_string_lossy().into_owned(),
                is_dir: meta.is_dir(),
                len: if meta.is_dir() { 0 } else { meta.len() },
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn mkdirs(&self, dir: &str) -> Result<()> {
        tokio::fs::create_dir_all(dir).await.map_err(io("mkdirs", dir))
    }

    async fn delete(&self, path: &str, recursive: bool) -> Result<bool> {
        let meta = match tokio::fs::symlink_metadata(path).await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io("stat", path)(e)),
        };
        let result = match (meta.is_dir(), recursive) {
            (true, true) => tokio::fs::remove_dir_all(path).await,
            (true, false) => tokio::fs::remove_dir(path).await,
            (false, _) => tokio::fs::remove_file(path).await,
        };
        result.map_err(io("delete", path))?;
        Ok(true)
    }

    async fn read(&self, path: &str) -> Result<Vec<u8>> {
        tokio::fs::read(path).await.map_err(io("read", path))
    }

    async fn exists(&self, path: &str) -> Result<bool> {
        match tokio::fs::symlink_metadata(path).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io("stat", path)(e)),
        }
    }
}

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("/", |(p, _)| if p.is_empty() { "/" } else { p })
}

/// The behaviour every backend must show, run against a scratch directory `base` that
/// does not exist yet. Used by the tests of both backends (and callable against any other).
pub async fn conformance(fs: &dyn FileSystem, base: &str) -> Result<()> {
    fn check(ok: bool, what: &str) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(Error::Inconsistent(format!("filesystem conformance: {what}")))
        }
    }
    check(!fs.exists(base).await?, "scratch dir must not exist")?;
    check(matches!(fs.list(base).await, Err(Error::NotFound(_))), "list of a missing dir is NotFound")?;
    fs.mkdirs(&format!("{base}/a/b")).await?;
    fs.mkdirs(&format!("{base}/a/b")).await?;
    check(fs.exists(&format!("{base}/a/b")).await?, "mkdirs creates parents")?;

    // create + write + close, parents made on the way.
    let f = format!("{base}/c/d/file.bin");
    let mut w = fs.create(&f).await?;
    w.write(Bytes::from_static(b"hello ")).await?;
    w.write(Bytes::from(vec![7u8; 100_000])).await?;
    w.close().await?;
    let data = fs.read(&f).await?;
    check(
        data.len() == 100_006 && data.starts_with(b"hello ") && data[6..].iter().all(|b| *b == 7),
        "read returns what was written",
    )?;
    check(matches!(fs.create(&f).await, Err(Error::AlreadyExists(_))), "create of an existing file is AlreadyExists")?;

    // rename: moves, never replaces, reports a missing source.
    let g = format!("{base}/a/b/moved.bin");
    fs.rename(&f, &g).await?;
    check(!fs.exists(&f).await? && fs.read(&g).await?.len() == 100_006, "rename moves")?;
    let mut w = fs.create(&f).await?;
    w.write(Bytes::from_static(b"other")).await?;
    w.close().await?;
    check(matches!(fs.rename(&f, &g).await, Err(Error::AlreadyExists(_))), "rename onto an existing file is AlreadyExists")?;
    check(fs.read(&g).await?.len() == 100_006, "a refused rename leaves the target alone")?;
    check(
        matches!(fs.rename(&format!("{base}/nope"), &format!("{base}/nope2")).await, Err(Error::NotFound(_))),
        "rename of a missing source is NotFound",
    )?;
    // Directories rename too (a run directory can be moved as a whole).
    fs.rename(&format!("{base}/c"), &format!("{base}/c2")).await?;
    check(fs.exists(&format!("{base}/c2/d/file.bin")).await?, "directories rename")?;

    // list: sorted names, kinds and lengths.
    let entries = fs.list(&format!("{base}/a/b")).await?;
    check(
        entries == vec![Entry { name: "moved.bin".into(), is_dir: false, len: 100_006 }],
        "list shows the file with its length",
    )?;
    let entries = fs.list(base).await?;
    let names: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.is_dir)).collect();
    check(names == vec![("a", true), ("c2", true)], "list is sorted and tells directories")?;

    // delete: files, empty dirs, recursive dirs, missing paths.
    check(fs.delete(&g, false).await?, "delete of a file")?;
    check(!fs.delete(&g, false).await?, "delete of a missing path is false")?;
    check(fs.delete(&format!("{base}/a/b"), false).await?, "delete of an empty dir")?;
    check(
        fs.delete(&format!("{base}/c2/d/file.bin"), false).await? && fs.delete(&format!("{base}/c2"), true).await?,
        "recursive delete",
    )?;
    check(fs.delete(base, true).await? && !fs.exists(base).await?, "delete of the scratch dir")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_backend_conforms() {
        let dir = tempfile::tempdir().unwrap();
        let base = format!("{}/scratch", dir.path().display());
        conformance(&LocalFs, &base).await.unwrap();
    }

    #[test]
    fn urls() {
        let d = open("file:///tmp//x/./y/", std::time::Duration::from_secs(1)).unwrap();
        assert_eq!(d.root, "/tmp/x/y");
        assert_eq!(d.path("a/b"), "/tmp/x/y/a/b");
        assert!(matches!(open("file://rel/x", std::time::Duration::from_secs(1)), Err(Error::BadUrl { .. })));
        assert!(matches!(open("s3://b/x", std::time::Duration::from_secs(1)), Err(Error::BadUrl { .. })));
        assert!(matches!(open("hdfs:///x", std::time::Duration::from_secs(1)), Err(Error::BadUrl { .. })));
    }
}
