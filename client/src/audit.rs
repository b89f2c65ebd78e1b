//! The opt-in audit hook: a producer or consumer given an [`AuditHook`] reports the
//! records it handled, so an audit tier (`fjord-audit`'s `AuditCounter`) counts them
//! without the application calling it by hand.
//!
//! The client knows nothing of audit windows or headers: at `send` it asks the hook for
//! the record's creation time and keeps that one number per record with its batch; when
//! the batch is acknowledged it hands the numbers of the acknowledged records back (a
//! failed batch reports nothing; a split batch only its records that succeeded). A
//! consumer reports the records each `poll` (or `recv`) returns. Without a hook the
//! producer keeps nothing and calls nothing.
//!
//! Transactions: a transactional producer hands the acknowledged records of a
//! transaction over when it commits, and never those of an aborted one; a consumer tells
//! the hook its `isolation.level`, since only a read_committed one leaves aborted records
//! out and so counts what such producers count.

use crate::consumer::{ConsumerRecord, IsolationLevel};
use crate::producer::ProducerRecord;

/// Receives the records a producer had acknowledged and a consumer returned.
pub trait AuditHook: Send + Sync + std::fmt::Debug {
    /// The creation time (ms since the epoch) to count `record` by, asked once at `send`;
    /// `timestamp` is the record's timestamp (its own, else the send time).
    fn created_ms(&self, record: &ProducerRecord, timestamp: i64) -> i64;

    /// Records of `topic` the broker acknowledged, by the creation times
    /// [`AuditHook::created_ms`] gave them. Called before their delivery futures resolve;
    /// for a transactional producer, when the transaction commits (never if it aborts).
    fn acknowledged(&self, topic: &str, created_ms: &[i64]);

    /// Records a consumer returned to the application.
    fn consumed(&self, records: &[ConsumerRecord]);

    /// Told once by each consumer created with this hook: what it reads. A read_committed
    /// consumer never returns records of aborted transactions.
    fn consumer_isolation(&self, _level: IsolationLevel) {}
}
