//! The crate's one error type.

/// What can stop the mirror or one of its sources.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A source or the target refused a request or could not be reached.
    #[error(transparent)]
    Client(#[from] fjord_client::Error),
    /// The configuration is unusable (missing or duplicate sources, bad template, ...).
    #[error("invalid mirror configuration: {0}")]
    InvalidConfig(String),
    /// `--topics` is not a valid regular expression.
    #[error("invalid --topics regex {regex:?}: {detail}")]
    InvalidRegex {
        /// The regex as given.
        regex: String,
        /// Why it does not compile (the regex crate's message, pointing into the text).
        detail: String,
    },
    /// The target cluster cannot be reached at start.
    #[error("target cluster {target} unreachable: {error}")]
    TargetUnreachable {
        /// The target bootstrap list.
        target: String,
        /// The client's error (its message is part of this one's).
        error: fjord_client::Error,
    },
    /// The target topic has fewer partitions than the source topic and the mirror's group
    /// copied from source partitions it lacks, so an earlier run spread records over it
    /// by key hash: growing it now would move keys. Refused unless repartitioning by key
    /// goes on.
    #[error(
        "target topic {target_topic:?} has {target_partitions} partitions, fewer than the {source_partitions} of \
         {source_topic:?} on source {alias}, and the mirror's group has copied from source partitions the target lacks \
         (an earlier run spread records by key hash): growing the target would move keys; pass --repartition-by-key to \
         go on spreading them by key hash (per-key order is kept), or mirror into a new target topic"
    )]
    FewerTargetPartitions {
        /// Source alias.
        alias: String,
        /// Source topic.
        source_topic: String,
        /// Its partition count.
        source_partitions: i32,
        /// Target topic.
        target_topic: String,
        /// Its partition count.
        target_partitions: i32,
    },
    /// The target did not acknowledge a copied record; nothing past it is committed.
    #[error("target did not acknowledge records of {topic}: {error}")]
    NotAcknowledged {
        /// Target topic.
        topic: String,
        /// The producer's error (its message is part of this one's).
        error: fjord_client::Error,
    },
    /// The target refused a copied record for what it holds (too large for the target
    /// topic, invalid for it, stamped outside its timestamp limits) where the mirror
    /// cannot hold just its partition (a record larger than the producer sends, found
    /// before it was sent; or a dead letter the target refused): sending it again cannot succeed, so this
    /// source's copying stops at it until the target takes it, or a dead-letter topic
    /// sets such records aside.
    #[error(
        "target topic {target:?} refused the record at offset {offset} of {topic}-{partition} from source {alias}: {error}; \
         this source's copying stops there (retried) until the target takes it, or --dead-letter-topic sets such records aside"
    )]
    Refused {
        /// Source alias.
        alias: String,
        /// Source topic.
        topic: String,
        /// Source partition.
        partition: i32,
        /// Source offset.
        offset: i64,
        /// The target topic that refused it.
        target: String,
        /// The producer's error (boxed: the variant would be the largest by far).
        error: Box<fjord_client::Error>,
    },
    /// With exactly once: the target refused records of the open transaction, which was
    /// aborted; the next session, started at once from the committed positions, writes
    /// them to the dead-letter topic, or without one holds their partitions at them.
    #[error(
        "the target refused {records} record(s) of source {alias}'s transaction, aborted; starting again from the committed \
         positions, where each such record is set aside in the dead-letter topic or, without one, holds its partition"
    )]
    RefusedInTransaction {
        /// Source alias.
        alias: String,
        /// How many records were refused.
        records: usize,
    },
    /// Starting the metrics endpoint failed (its TLS files, or Basic without a store).
    #[error("metrics endpoint: {0}")]
    Metrics(#[source] fjord_auth::Error),
    /// Reading a running mirror's status over HTTP failed.
    #[error("cannot read mirror status from {url}: {detail}")]
    Status {
        /// The status URL.
        url: String,
        /// What went wrong.
        detail: String,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
