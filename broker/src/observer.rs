//! The observer hook: what a binary embedding the broker may watch of it without the
//! broker depending on the watcher. The audit's broker tier (`fjord_audit::BrokerTier`,
//! wired by the `fjord` binary when `audit.enable`) is the one implementation: the hook
//! is owned here, low, and implemented above, as the client's `AuditHook` is.
//!
//! What the broker calls, and when:
//! - [`BrokerObserver::serving`] once its listeners accept, with its own address (an
//!   observer that publishes to the cluster talks to this broker like any client);
//! - [`BrokerObserver::tally`] before each append it makes as partition leader for a
//!   producer, and [`AppendTally::record`] for each record as the append's validation
//!   walks it (the walk happens anyway, so observing costs no second decode);
//!   [`AppendTally::appended`] once the append succeeded and was not a duplicate (a failed
//!   or duplicate append drops the tally unseen); followers' appends are not observed;
//! - [`BrokerObserver::transaction_ended`] once this broker, as partition leader, appended
//!   a COMMIT or ABORT marker (WriteTxnMarkers) for a producer: the records of its
//!   transaction shown to a tally before are committed or aborted with it;
//! - [`BrokerObserver::before_handover`] at a controlled shutdown, while this broker still
//!   leads its partitions, and [`BrokerObserver::stopping`] after the handover, while
//!   connections are still served. Both are awaited; the observer bounds them.

use fjord_record::{BatchHeader, RecordFrame};
use futures::future::BoxFuture;

/// Where this broker serves, as its observer may reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    /// `broker.id`.
    pub broker_id: i32,
    /// The advertised host and port of the inter-broker listener.
    pub host: String,
    /// See `host`.
    pub port: i32,
    /// `host:port` a client of this broker connects to: a plaintext listener when there
    /// is one, else the inter-broker listener.
    pub bootstrap: String,
    /// Kafka client settings (`security.protocol`, `sasl.*`, `ssl.*`) that reach
    /// `bootstrap`: none for a plaintext listener; for the inter-broker listener, its
    /// protocol with this broker's own identity (its inter-broker SASL user, its
    /// truststore, its keystore as client certificate), so an observer publishes on a
    /// broker with no plaintext listener at all.
    pub client_properties: ClientProperties,
}

/// Kafka client settings as `(key, value)` pairs; `Debug` hides every password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ClientProperties(pub Vec<(String, String)>);

impl std::fmt::Debug for ClientProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, if k.contains("password") { "<hidden>" } else { v.as_str() })))
            .finish()
    }
}

/// Watches the broker; see the module documentation for when each method is called.
pub trait BrokerObserver: Send + Sync + std::fmt::Debug {
    /// The broker accepts connections at `at`.
    fn serving(&self, at: &Serving);

    /// A tally for one leader append to `topic`, `None` when this observer does not
    /// watch the topic.
    fn tally(&self, topic: &str) -> Option<Box<dyn AppendTally>>;

    /// The transaction of `producer_id` in `topic` ended: committed, or aborted (its
    /// records will never reach a read_committed consumer).
    fn transaction_ended(&self, topic: &str, producer_id: i64, committed: bool);

    /// A controlled shutdown is about to hand leadership over.
    fn before_handover(&self) -> BoxFuture<'_, ()>;

    /// The broker is about to stop accepting connections.
    fn stopping(&self) -> BoxFuture<'_, ()>;
}

/// The records of one leader append, shown one by one as the validation walks them.
pub trait AppendTally: Send {
    /// One record of the batch `header` (control batches included).
    fn record(&mut self, header: &BatchHeader, record: &RecordFrame<'_>);

    /// The append of `topic` succeeded and was not a duplicate.
    fn appended(self: Box<Self>, topic: &str);
}
