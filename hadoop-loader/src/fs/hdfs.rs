//! HDFS through `hdfs-native` (the namenode and datanode RPC protocols, no JVM).
//!
//! hdfs-native retries an unreachable namenode with failover and backoff for well over a
//! minute by default. A nightly job must fail fast and say why instead, so failover
//! attempts are set to one and every call is bounded by a timeout; a call that runs out is
//! [`Error::Timeout`] naming the namenode.
//!
//! Cluster settings come the Hadoop way: `HADOOP_CONF_DIR` (or `HADOOP_HOME/etc/hadoop`)
//! `core-site.xml`/`hdfs-site.xml` for nameservices and HA namenodes, `HADOOP_USER_NAME`
//! for the user without Kerberos; the failover settings above override the files.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use hdfs_native::{Client, ClientBuilder, HdfsError, WriteOptions};

use super::{Entry, FileSystem, FileWriter};
use crate::{Error, Result};

/// An HDFS namespace reached through one namenode (or a nameservice in the config files
/// pointed to by `HADOOP_CONF_DIR`).
pub struct HdfsFs {
    client: Client,
    namenode: String,
    timeout: Duration,
}

impl HdfsFs {
    /// A client for `hdfs://<authority>`; connects lazily, on the first call.
    pub fn connect(authority: &str, timeout: Duration) -> Result<Self> {
        let url = format!("hdfs://{authority}");
        let client = ClientBuilder::new()
            .with_url(url.clone())
            .with_config([
                ("dfs.client.failover.max.attempts", "1"),
                ("dfs.client.failover.sleep.base.millis", "100"),
                ("dfs.client.failover.sleep.max.millis", "500"),
            ])
            .build()
            .map_err(|source| Error::Hdfs {
                op: "connect",
                path: url.clone(),
                namenode: authority.to_string(),
                source: Box::new(source),
            })?;
        Ok(Self { client, namenode: authority.to_string(), timeout })
    }

    async fn bounded<T>(&self, op: &'static str, path: &str, call: impl Future<Output = Result<T, HdfsError>>) -> Result<T> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|e| map(op, path, &self.namenode, e)),
            Err(_) => Err(Error::Timeout { op, path: path.to_string(), namenode: self.namenode.clone(), timeout: self.timeout }),
        }
    }

    async fn status(&self, path: &str) -> Result<Option<hdfs_native::client::FileStatus>> {
        match self.bounded("stat", path, self.client.get_file_info(path)).await {
            Ok(s) => Ok(Some(s)),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn map(op: &'static str, path: &str, namenode: &str, e: HdfsError) -> Error {
    match e {
        HdfsError::FileNotFound(_) => Error::NotFound(path.to_string()),
        HdfsError::AlreadyExists(_) => Error::AlreadyExists(path.to_string()),
        other => Error::Hdfs { op, path: path.to_string(), namenode: namenode.to_string(), source: Box::new(other) },
    }
}

struct HdfsWriter {
    path: String,
    namenode: String,
    timeout: Duration,
    writer: hdfs_native::file::FileWriter,
}

impl HdfsWriter {
    fn finish<T>(&self, op: &'static str, outcome: Result<Result<T, HdfsError>, tokio::time::error::Elapsed>) -> Result<T> {
        match outcome {
            Ok(result) => result.map_err(|e| map(op, &self.path, &self.namenode, e)),
            Err(_) => Err(Error::Timeout { op, path: self.path.clone(), namenode: self.namenode.clone(), timeout: self.timeout }),
        }
    }
}

#[async_trait]
impl FileWriter for HdfsWriter {
    async fn write(&mut self, data: Bytes) -> Result<()> {
        let outcome = tokio::time::timeout(self.timeout, self.writer.write_bytes(data)).await;
        self.finish("write", outcome).map(drop)
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        // close() waits for the pipeline's acks and completes the file at the namenode.
        let outcome = tokio::time::timeout(self.timeout, self.writer.close()).await;
        self.finish("close", outcome)
    }
}

#[async_trait]
impl FileSystem for HdfsFs {
    async fn create(&self, path: &str) -> Result<Box<dyn FileWriter>> {
        let writer = self.bounded("create", path, self.client.create(path, WriteOptions::default())).await?;
        Ok(Box::new(HdfsWriter { path: path.to_string(), namenode: self.namenode.clone(), timeout: self.timeout, writer }))
    }

    async fn rename(&self, from: &str, to: &str) -> Result<()> {
        // Map the namenode's refusals to the trait's errors (its exceptions arrive as RPC
        // errors with a Java class name, not as typed errors).
        if self.status(from).await?.is_none() {
            return Err(Error::NotFound(from.to_string()));
        }
        if self.status(to).await?.is_some() {
            return Err(Error::AlreadyExists(to.to_string()));
        }
        self.bounded("rename", from, self.client.rename(from, to, false)).await
    }

    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let statuses = self.bounded("list", dir, self.client.list_status(dir, false)).await?;
        let mut out: Vec<Entry> = statuses
            .into_iter()
            .map(|s| Entry {
                name: s.path.rsplit('/').next().unwrap_or_default().to_string(),
                is_dir: s.isdir,
                len: if s.isdir { 0 } else { s.length as u64 },
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn mkdirs(&self, dir: &str) -> Result<()> {
        self.bounded("mkdirs", dir, self.client.mkdirs(dir, 0o755, true)).await
    }

    async fn delete(&self, path: &str, recursive: bool) -> Result<bool> {
        self.bounded("delete", path, self.client.delete(path, recursive)).await
    }

    async fn read(&self, path: &str) -> Result<Vec<u8>> {
        let mut reader = self.bounded("open", path, self.client.read(path)).await?;
        let len = reader.file_length();
        let bytes = self.bounded("read", path, reader.read_bytes(len)).await?;
        Ok(bytes.to_vec())
    }

    async fn exists(&self, path: &str) -> Result<bool> {
        Ok(self.status(path).await?.is_some())
    }
}
