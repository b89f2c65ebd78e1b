//! The Hadoop loader: a batch job that copies topics into HDFS (or a local directory) as
//! hourly Avro files and commits the data together with the offsets it covers.
//!
//! The 2011 paper's point is that consumers keep their own offsets, so a loader can commit
//! data and offsets as one unit: this crate keeps its offsets in the destination, beside the
//! data, and a job run either commits everything it read or nothing. A run that is killed
//! at any moment leaves state the next run completes or rolls back, so the final layout
//! holds every record between committed offsets exactly once. No consumer group is used.
//!
//! # Layout
//! - [`fs`]: the small [`FileSystem`] trait (create, write, rename, list,
//!   mkdirs, delete, read) with the local `file://` backend and [`fs::hdfs`] on `hdfs-native`;
//!   [`fs::open`] picks one by URL scheme.
//! - [`layout`]: where things go in the destination, UTC hour arithmetic, file names.
//! - [`ocf`]: an Avro Object Container File writer (null, deflate, snappy) and the generic
//!   envelope schema for records that carry no registered schema.
//! - [`job`]: [`LoaderConfig`], [`run_once`]; its steps in `job/plan.rs` (which partitions,
//!   from where to where), `job/write.rs` (records into files) and `job/commit.rs` (the
//!   commit protocol and recovery).
//!
//! # Destination layout
//! ```text
//! <dest>/<topic>/hourly/YYYY/MM/DD/HH/<topic>+<partition>+<firstOffset>+<lastOffset>.avro
//! <dest>/<topic>/hourly/YYYY/MM/DD/HH/_SUCCESS        once no partition can add to the hour
//! <dest>/_fjord/offsets/<job>/<seq:020>.json           committed state: offsets, counts
//! <dest>/_fjord/errors/<job>/<topic>/<topic>+<partition>+<first>+<last>.jsonl  bad records
//! <dest>/_fjord/tmp/<job>/<run-id>/                    a run in progress
//! ```
//!
//! # Commit protocol (invariants)
//! 1. A run writes every file under its own `tmp/<job>/<run-id>/files/`.
//! 2. When every file is complete it writes the next state (`offsets.json`) and then
//!    `_MANIFEST.json` (created under another name and renamed, so it exists only whole).
//!    The manifest lists every move and is the run's point of no return.
//! 3. It renames each file into the final layout, then renames `offsets.json` to
//!    `offsets/<job>/<seq>.json`: the commit. Renames never replace an existing file.
//! 4. `_SUCCESS` markers follow from the committed state and are (re)written after it.
//!
//! On start, a run directory without a manifest is deleted (nothing of it is visible), and
//! one with a manifest is rolled forward (remaining moves, then the state). Offsets in the
//! final file names make every moved file's range checkable against committed offsets.
//! One run per job at a time: schedulers must not overlap runs of the same job.

pub mod fs;
pub mod job;
pub mod layout;
pub mod ocf;

pub use fs::{FileSystem, FileWriter};
pub use job::{run_once, BadRecordPolicy, CrashHook, LoaderConfig, Progress, RunSummary, Step, Until};
pub use ocf::Codec;

use std::time::Duration;

/// Everything the loader can fail with. Causes are `source()`s, not repeated in the
/// message: print with the chain (`{:#}` of anyhow, or walk `source()`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The destination URL is not `file:///path` or `hdfs://host:port/path`.
    #[error("bad destination URL {url:?}: {reason}")]
    BadUrl {
        /// As given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The `--topics` pattern does not compile.
    #[error("bad topic pattern")]
    BadTopicPattern(#[from] regex::Error),
    /// A job name that cannot be a directory name.
    #[error("bad job name {0:?}: use letters, digits, '.', '_' and '-'")]
    BadJobName(String),
    /// Local filesystem failure.
    #[error("{op} {path}")]
    Io {
        /// Operation (create, rename, ...).
        op: &'static str,
        /// Path operated on.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// HDFS failure.
    #[error("HDFS {op} {path} (namenode {namenode})")]
    Hdfs {
        /// Operation.
        op: &'static str,
        /// Path operated on.
        path: String,
        /// The namenode address.
        namenode: String,
        /// Cause.
        #[source]
        source: Box<hdfs_native::HdfsError>,
    },
    /// An HDFS call did not finish in time (the namenode or a datanode is unreachable).
    #[error("HDFS {op} {path} gave no answer within {timeout:?}: is the namenode at {namenode} reachable?")]
    Timeout {
        /// Operation.
        op: &'static str,
        /// Path operated on.
        path: String,
        /// The namenode address.
        namenode: String,
        /// The bound that passed.
        timeout: Duration,
    },
    /// Create or rename onto a path that exists (the loader never replaces files).
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// The path does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// Talking to the brokers failed.
    #[error("Kafka client")]
    Kafka(#[from] Box<fjord_client::Error>),
    /// Talking to the schema registry failed (not a bad record: the job stops).
    #[error("schema registry")]
    Registry(#[source] Box<fjord_schema_registry::Error>),
    /// A record could not be written and the policy is [`BadRecordPolicy::Fail`].
    #[error("bad record {topic}-{partition} at offset {offset}: {reason}")]
    BadRecord {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// Why it was rejected.
        reason: String,
    },
    /// A state or manifest file in the destination does not parse.
    #[error("corrupt loader state {path}")]
    CorruptState {
        /// The file.
        path: String,
        /// Parser error.
        #[source]
        source: serde_json::Error,
    },
    /// The destination's state contradicts itself (e.g. a manifest older than the committed
    /// state but never cleaned up, or a committed offset beyond the partition's end).
    #[error("inconsistent loader state: {0}")]
    Inconsistent(String),
    /// A partition stopped delivering records before reaching the end offset of the run.
    #[error("no records from {topic}-{partition} for {idle:?} at offset {offset} (end offset of this run {end})")]
    Stalled {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Next offset expected.
        offset: i64,
        /// Where the run meant to stop.
        end: i64,
        /// How long nothing came.
        idle: Duration,
    },
    /// The test crash hook stopped the run at this step.
    #[error("injected crash at {0:?}")]
    InjectedCrash(Step),
}

impl From<fjord_client::Error> for Error {
    fn from(e: fjord_client::Error) -> Self {
        Error::Kafka(Box::new(e))
    }
}

/// `Result` with the loader's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
