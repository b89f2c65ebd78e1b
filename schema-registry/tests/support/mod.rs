//! Starting real registry instances (the production `run`) on 127.0.0.1:0 for the tests.
#![allow(dead_code, unreachable_pub)] // each test binary uses its own part of this module

use std::sync::Arc;

use fjord_coord::{EmbeddedStore, Store};
use fjord_schema_registry::{run, RegistryConfig};
use serde_json::Value;
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub mod scenarios;

/// An embedded metadata store in a temporary directory.
pub fn embedded_store() -> (TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Store = Arc::new(EmbeddedStore::open(dir.path()).expect("open embedded store"));
    (dir, store)
}

/// One running registry instance.
pub struct Registry {
    pub url: String,
    shutdown: CancellationToken,
    task: Option<JoinHandle<fjord_schema_registry::Result<()>>>,
}

impl Registry {
    pub async fn start(store: Store) -> Self {
        Self::start_with(RegistryConfig::default(), store).await
    }

    pub async fn start_with(config: RegistryConfig, store: Store) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(config, store, listener, shutdown.clone()));
        Self { url, shutdown, task: Some(task) }
    }

    /// Stops the instance and checks it shut down cleanly.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let task = self.task.take().expect("running");
        task.await.expect("registry task panicked").expect("registry run failed");
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A response: status, content type and JSON body (Null when the body is not JSON).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Value,
}

impl Reply {
    /// Asserts a Confluent error document with this status and error code.
    #[track_caller]
    pub fn assert_error(&self, status: u16, code: i64) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.body["error_code"], code, "{self:?}");
        assert!(self.body["message"].as_str().is_some_and(|m| !m.is_empty()), "{self:?}");
    }

    /// Asserts 200 and returns the body.
    #[track_caller]
    pub fn ok(self) -> Value {
        assert_eq!(self.status, 200, "{self:?}");
        assert_eq!(self.content_type, "application/vnd.schemaregistry.v1+json", "{self:?}");
        self.body
    }
}

/// A tiny HTTP helper over reqwest.
pub struct Http {
    client: reqwest::Client,
    base: String,
}

impl Http {
    pub fn new(base: &str) -> Self {
        Self { client: reqwest::Client::new(), base: base.to_string() }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(reqwest::Method::GET, path, None, None).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.send(reqwest::Method::DELETE, path, None, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Reply {
        self.send(reqwest::Method::POST, path, Some(body.to_string()), Some("application/vnd.schemaregistry.v1+json")).await
    }

    pub async fn put(&self, path: &str, body: Value) -> Reply {
        self.send(reqwest::Method::PUT, path, Some(body.to_string()), Some("application/vnd.schemaregistry.v1+json")).await
    }

    pub async fn send(&self, method: reqwest::Method, path: &str, body: Option<String>, content_type: Option<&str>) -> Reply {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        if let Some(body) = body {
            req = req.body(body);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let bytes = resp.bytes().await.expect("body");
        Reply { status, content_type, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) }
    }
}

/// Registers `schema` (JSON text) under `subject`, returning the raw reply.
pub async fn register(http: &Http, subject: &str, schema: &str) -> Reply {
    http.post(&format!("/subjects/{subject}/versions"), serde_json::json!({ "schema": schema })).await
}

/// A record schema named `R` with the given fields JSON.
pub fn record(fields: &str) -> String {
    format!(r#"{{"type":"record","name":"R","namespace":"test","fields":[{fields}]}}"#)
}
