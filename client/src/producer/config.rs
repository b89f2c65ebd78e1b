//! Producer settings: [`ProducerConfig`] with Kafka's names and defaults, [`Acks`], and
//! the checks `connect` makes, including whether the settings allow idempotence.

use std::sync::Arc;
use std::time::Duration;

use fjord_record::Compression;
use tokio::sync::Semaphore;

use super::idempotence::MAX_IN_FLIGHT_IDEMPOTENT;
use crate::audit::AuditHook;
use crate::cluster::ClientConfig;
use crate::error::{Error, Result};

/// How many replicas must have a batch before the broker answers (`acks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// `acks=0`: no response; the record counts as sent once written to the socket.
    None,
    /// `acks=1`: the leader has appended it.
    Leader,
    /// `acks=all`: every in-sync replica has it.
    All,
}

impl Acks {
    pub(super) fn wire(self) -> i16 {
        match self {
            Acks::None => 0,
            Acks::Leader => 1,
            Acks::All => -1,
        }
    }
}

impl std::str::FromStr for Acks {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "0" => Ok(Acks::None),
            "1" => Ok(Acks::Leader),
            "all" | "-1" => Ok(Acks::All),
            other => Err(Error::InvalidConfig(format!("acks must be 0, 1 or all, not {other:?}"))),
        }
    }
}

/// Producer settings (Kafka's names in the comments).
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Connection and metadata settings.
    pub client: ClientConfig,
    /// `acks`.
    pub acks: Acks,
    /// `batch.size`: a partition's batch is closed once it holds this many bytes.
    pub batch_size: usize,
    /// `linger.ms`: how long an open batch may wait for more records.
    pub linger: Duration,
    /// `compression.type`.
    pub compression: Compression,
    /// `max.in.flight.requests.per.connection`.
    pub max_in_flight: usize,
    /// `retries`: attempts after the first one, bounded by `delivery_timeout` too.
    pub retries: u32,
    /// `delivery.timeout.ms`: bound from `send` to success or failure.
    pub delivery_timeout: Duration,
    /// `buffer.memory`: bytes of records waiting to be sent or acknowledged.
    pub buffer_memory: usize,
    /// `max.block.ms`: how long `send` may wait for buffer space (zero fails at once),
    /// and for metadata showing a record's explicit partition (fetched at least once).
    pub max_block: Duration,
    /// `max.request.size`: largest produce request, and so largest record.
    pub max_request_size: usize,
    /// `enable.idempotence`: retries never duplicate a batch (see the module docs).
    /// `None` is the Java client's default: on, unless `acks`, `retries` or
    /// `max_in_flight` conflict with it (acks other than all, no retries, more than 5
    /// in flight), in which case it is off; `Some(true)` with a conflict is an error.
    pub enable_idempotence: Option<bool>,
    /// Opt-in audit: told about every record once it is acknowledged (see
    /// [`crate::audit`]); `None` costs nothing.
    pub audit: Option<Arc<dyn AuditHook>>,
    /// `transactional.id`: makes the producer transactional (see
    /// [`crate::producer`]'s transactions); it implies idempotence.
    pub transactional_id: Option<String>,
    /// `transaction.timeout.ms`: the coordinator aborts a transaction open longer.
    pub transaction_timeout: Duration,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            client: ClientConfig::default(),
            acks: Acks::All,
            batch_size: 16 * 1024,
            linger: Duration::from_millis(5),
            compression: Compression::None,
            max_in_flight: 5,
            retries: u32::MAX,
            delivery_timeout: Duration::from_secs(120),
            buffer_memory: 32 * 1024 * 1024,
            max_block: Duration::from_secs(60),
            max_request_size: 1024 * 1024,
            enable_idempotence: None,
            audit: None,
            transactional_id: None,
            transaction_timeout: Duration::from_secs(60),
        }
    }
}

impl ProducerConfig {
    pub(super) fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidConfig(m.into()));
        if self.max_in_flight == 0 {
            return bad("max.in.flight.requests.per.connection must be at least 1");
        }
        if self.buffer_memory < self.max_request_size {
            return bad("buffer.memory must be at least max.request.size");
        }
        if self.buffer_memory > Semaphore::MAX_PERMITS || self.max_request_size > u32::MAX as usize {
            return bad("buffer.memory is too large");
        }
        if self.transactional_id.is_some() && !self.idempotent() {
            return bad("transactional.id needs idempotence (enable.idempotence, acks=all, retries > 0, max.in.flight <= 5)");
        }
        if self.transactional_id.as_deref() == Some("") {
            return bad("transactional.id must not be empty");
        }
        if self.enable_idempotence == Some(true) && self.idempotence_conflict().is_some() {
            return Err(Error::InvalidConfig(format!(
                "enable.idempotence needs {}",
                self.idempotence_conflict().unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// What keeps idempotence from working with these settings, if anything.
    fn idempotence_conflict(&self) -> Option<&'static str> {
        if self.acks != Acks::All {
            Some("acks=all")
        } else if self.retries == 0 {
            Some("retries > 0")
        } else if self.max_in_flight > MAX_IN_FLIGHT_IDEMPOTENT {
            Some("max.in.flight.requests.per.connection <= 5")
        } else {
            None
        }
    }

    /// Whether the producer is idempotent (see [`ProducerConfig::enable_idempotence`]).
    pub fn idempotent(&self) -> bool {
        self.enable_idempotence.unwrap_or_else(|| self.idempotence_conflict().is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_parse_like_kafka() {
        assert_eq!("0".parse::<Acks>().unwrap(), Acks::None);
        assert_eq!("1".parse::<Acks>().unwrap(), Acks::Leader);
        assert_eq!("all".parse::<Acks>().unwrap(), Acks::All);
        assert_eq!("-1".parse::<Acks>().unwrap(), Acks::All);
        assert!("2".parse::<Acks>().is_err());
    }

    #[test]
    fn config_is_validated() {
        let c = ProducerConfig { max_in_flight: 0, ..ProducerConfig::default() };
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
        let c = ProducerConfig { buffer_memory: 10, ..ProducerConfig::default() };
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
        assert!(ProducerConfig::default().validate().is_ok());
    }

    #[test]
    fn idempotence_is_on_by_default_unless_settings_conflict() {
        assert!(ProducerConfig::default().idempotent());
        for c in [
            ProducerConfig { acks: Acks::Leader, ..ProducerConfig::default() },
            ProducerConfig { retries: 0, ..ProducerConfig::default() },
            ProducerConfig { max_in_flight: 6, ..ProducerConfig::default() },
        ] {
            assert!(!c.idempotent());
            assert!(c.validate().is_ok());
            let explicit = ProducerConfig { enable_idempotence: Some(true), ..c };
            assert!(matches!(explicit.validate(), Err(Error::InvalidConfig(_))));
        }
        assert!(!ProducerConfig { enable_idempotence: Some(false), ..ProducerConfig::default() }.idempotent());
    }
}
