//! [`GatewayConfig`]: every setting of the gateway, with its default declared once here.

use std::time::Duration;

use crate::{Error, Result};

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// `bootstrap.servers` of the cluster the gateway publishes into (comma-separated).
    pub bootstrap: String,
    /// Base URL of the schema registry (`http://host:8081`); `None` disables Avro.
    pub registry_url: Option<String>,
    /// Largest HTTP request body; larger ones get 413 before being parsed.
    pub max_body_bytes: usize,
    /// Largest single event (key + value + headers); larger ones are refused with the
    /// record's index before anything of the request is produced.
    pub max_event_bytes: usize,
    /// Bytes of events accepted but not yet acknowledged, over all requests. A request
    /// that would go past it is refused with 429 / RESOURCE_EXHAUSTED.
    pub buffer_bytes: usize,
    /// What a refused caller is told to wait (`Retry-After`).
    pub retry_after: Duration,
    /// Bound on waiting for the brokers (connect, metadata, acknowledgement): past it the
    /// answer is 503 / UNAVAILABLE, never a hang.
    pub broker_timeout: Duration,
    /// `linger.ms` of the shared producer: how long a partition's batch waits for events
    /// from other requests before it is sent.
    pub linger: Duration,
    /// `batch.size` of the shared producer.
    pub batch_bytes: usize,
    /// Upper bound on `max_bytes` of a fetch.
    pub max_fetch_bytes: usize,
    /// Upper bound on `max_wait_ms` of a fetch.
    pub max_fetch_wait: Duration,
    /// Value of the `fjord.host` header stamped on events; `None` = this machine's hostname.
    pub host_name: Option<String>,
    /// How often the gateway tier's audit counts (events acknowledged, per topic and
    /// window of creation time) are published to `_audit`; `None` = no audit counting.
    pub audit_interval: Option<Duration>,
    /// Audit window length; every tier and the report must use the same.
    pub audit_window: Duration,
    /// Datacenter / cluster name written into the gateway's audit records.
    pub audit_cluster: String,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            bootstrap: "127.0.0.1:9092".into(),
            registry_url: None,
            max_body_bytes: 10 * 1024 * 1024,
            // The client's default max.request.size less batch overhead: one event must
            // fit one produce request.
            max_event_bytes: 1024 * 1024 - 1024,
            buffer_bytes: 64 * 1024 * 1024,
            retry_after: Duration::from_secs(1),
            broker_timeout: Duration::from_secs(10),
            linger: Duration::from_millis(5),
            batch_bytes: 256 * 1024,
            max_fetch_bytes: 8 * 1024 * 1024,
            max_fetch_wait: Duration::from_secs(30),
            host_name: None,
            audit_interval: None,
            audit_window: Duration::from_millis(fjord_audit::DEFAULT_WINDOW_MS as u64),
            audit_cluster: "default".into(),
        }
    }
}

impl GatewayConfig {
    /// A config publishing into `bootstrap`, defaults elsewhere.
    pub fn new(bootstrap: impl Into<String>) -> Self {
        Self { bootstrap: bootstrap.into(), ..Self::default() }
    }

    /// Rejects settings the gateway cannot run with.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.bootstrap.split(',').all(|s| s.trim().is_empty()) {
            return bad("bootstrap is empty".into());
        }
        if self.max_event_bytes == 0 || self.max_event_bytes >= 1024 * 1024 {
            return bad(format!("max_event_bytes = {} must be in 1..1048576 (one produce request)", self.max_event_bytes));
        }
        if self.buffer_bytes < self.max_body_bytes {
            return bad(format!(
                "buffer_bytes = {} is below max_body_bytes = {}: a full-size request could never be accepted",
                self.buffer_bytes, self.max_body_bytes
            ));
        }
        if self.audit_interval.is_some_and(|i| i.is_zero()) || self.audit_window.as_millis() == 0 {
            return bad("audit_interval and audit_window must be positive".into());
        }
        if self.broker_timeout.is_zero() {
            return bad("broker_timeout must be positive".into());
        }
        if self.max_fetch_bytes == 0 || self.max_fetch_bytes > i32::MAX as usize {
            return bad(format!("max_fetch_bytes = {} is out of range", self.max_fetch_bytes));
        }
        Ok(())
    }

    /// The `fjord.host` value: the configured name or this machine's hostname.
    pub(crate) fn resolved_host_name(&self) -> String {
        self.host_name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "unknown".into())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_settings_are_named() {
        GatewayConfig::default().validate().unwrap();
        let c = GatewayConfig { buffer_bytes: 1024, ..GatewayConfig::default() };
        assert!(c.validate().unwrap_err().to_string().contains("buffer_bytes"));
        let c = GatewayConfig::new(" , ");
        assert!(c.validate().unwrap_err().to_string().contains("bootstrap"));
        assert!(!GatewayConfig::default().resolved_host_name().is_empty());
        assert_eq!(GatewayConfig { host_name: Some("h1".into()), ..GatewayConfig::default() }.resolved_host_name(), "h1");
    }
}
