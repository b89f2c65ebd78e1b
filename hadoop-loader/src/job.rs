//! One run of a load job: recover what a previous run left, read every matching partition
//! from its committed offset to the end offset fixed at the start, write hourly Avro
//! files into the run's tmp directory, then commit (see the crate docs for the protocol).
//!
//! # Layout
//! - this file: the job's settings ([`LoaderConfig`]), what a run reports ([`RunSummary`],
//!   [`Progress`]), and [`run_once`], which runs the three steps in order;
//! - `plan`: which partitions a run reads, from where to where (the arithmetic a pure
//!   function of the committed state and the offsets the brokers report);
//! - `write`: reading the records and writing them into data and error files in the run
//!   directory;
//! - `commit`: the committed state ([`JobState`]), the next state a run commits (a pure
//!   function), the manifest, the moves into place, recovery of dead runs, `_SUCCESS`
//!   markers.

mod commit;
mod plan;
mod write;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjord_client::{Admin, ClientConfig};
use fjord_schema_registry::RegistryClient;

pub use commit::{load_state, JobState};

use crate::ocf::Codec;
use crate::{Error, Result};

/// Where a run stops reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Until {
    /// Each partition's high watermark at the start of the run.
    #[default]
    Latest,
    /// The first offset with a timestamp at or after this (ms), capped by the high watermark.
    Timestamp(i64),
}

/// What to do with a record that cannot be written (unknown schema id, undecodable bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BadRecordPolicy {
    /// Write it to `_fjord/errors/…` with its offset and the reason, count it, go on.
    #[default]
    Quarantine,
    /// Fail the run ([`Error::BadRecord`]); nothing is committed.
    Fail,
}

/// A step of a run where the test crash hook may stop it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// After taking this many records (1-based) into the run.
    Read(u64),
    /// Every data and error file of the run is complete in its tmp directory.
    FilesWritten,
    /// The new state and the manifest are in the run directory.
    ManifestWritten,
    /// Move number `index` (0-based) into the final layout is done; `recovery` when a later
    /// run is finishing it.
    Moved {
        /// Which move.
        index: usize,
        /// Whether recovery performed it.
        recovery: bool,
    },
    /// The new state file is in place: the run is committed.
    StateInstalled,
}

/// Called at every [`Step`]; returning `true` stops the run right there with
/// [`Error::InjectedCrash`], leaving the destination as a crash would (tests only).
pub type CrashHook = Arc<dyn Fn(&Step) -> bool + Send + Sync>;

/// Settings of a load job.
#[derive(Clone)]
pub struct LoaderConfig {
    /// `host:port[,host:port…]` of the brokers.
    pub bootstrap: String,
    /// How to reach them: `security.protocol`, `sasl.*`, `ssl.*` (for reading the topics
    /// and for publishing the audit counts alike).
    pub security: fjord_client::SecurityConfig,
    /// Regex; topics whose whole name matches are loaded (internal topics never are).
    pub topics: String,
    /// `file:///path` or `hdfs://namenode:port/path`.
    pub dest: String,
    /// Schema registry URL; without one every record is written in the envelope schema.
    pub registry: Option<String>,
    /// Job name: separates offsets, errors and runs of different jobs in one destination.
    pub job: String,
    /// Where to stop reading.
    pub until: Until,
    /// Stop after this many records in the run (in total); the next run goes on from there.
    pub max_records: Option<u64>,
    /// Avro block codec.
    pub codec: Codec,
    /// Bad record handling.
    pub on_bad_record: BadRecordPolicy,
    /// A data file is closed and a new one started past this size.
    pub max_file_bytes: u64,
    /// Bound on every HDFS call.
    pub hdfs_timeout: Duration,
    /// A run fails when no record arrives for this long while partitions are unfinished.
    pub idle_timeout: Duration,
    /// Test hook; `None` in production.
    pub crash_hook: Option<CrashHook>,
    /// The loader's audit tier: when set, each committed run publishes how many records
    /// it loaded per topic and window to `_audit` (counts of committed data only).
    pub audit: Option<std::sync::Arc<fjord_audit::AuditCounter>>,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        Self {
            bootstrap: "127.0.0.1:9092".into(),
            security: Default::default(),
            topics: ".*".into(),
            dest: "file:///tmp/fjord-load".into(),
            registry: None,
            job: "default".into(),
            until: Until::Latest,
            max_records: None,
            codec: Codec::Deflate,
            on_bad_record: BadRecordPolicy::Quarantine,
            max_file_bytes: 256 * 1024 * 1024,
            hdfs_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            crash_hook: None,
            audit: None,
        }
    }
}

impl fmt::Debug for LoaderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoaderConfig")
            .field("bootstrap", &self.bootstrap)
            .field("security", &self.security)
            .field("topics", &self.topics)
            .field("dest", &self.dest)
            .field("registry", &self.registry)
            .field("audit", &self.audit.as_ref().map(|a| a.tier().to_owned()))
            .field("job", &self.job)
            .field("until", &self.until)
            .field("max_records", &self.max_records)
            .field("codec", &self.codec)
            .field("on_bad_record", &self.on_bad_record)
            .field("max_file_bytes", &self.max_file_bytes)
            .field("hdfs_timeout", &self.hdfs_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("crash_hook", &self.crash_hook.is_some())
            .finish()
    }
}

/// Receives progress of a run (the CLI draws a bar with it).
pub trait Progress: Send + Sync {
    /// Reading starts: partitions with records to read and the records between their
    /// start and end offsets.
    fn start(&self, _partitions: usize, _records: u64) {}
    /// Records taken (and their key + value bytes).
    fn advance(&self, _records: u64, _bytes: u64) {}
    /// A partition reached its end offset.
    fn partition_done(&self) {}
}

impl Progress for () {}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// The job.
    pub job: String,
    /// This run's id.
    pub run_id: String,
    /// The state number committed by this run; `None` when there was nothing to read.
    pub committed_seq: Option<u64>,
    /// Records written to data files.
    pub records: u64,
    /// Records quarantined as bad.
    pub bad_records: u64,
    /// Key + value bytes read.
    pub bytes_in: u64,
    /// Bytes of files written.
    pub bytes_out: u64,
    /// Data and error files committed.
    pub files: usize,
    /// Partitions read.
    pub partitions: usize,
    /// Runs of earlier, dead jobs that recovery deleted (they had not reached their manifest).
    pub rolled_back: usize,
    /// Runs of earlier, dead jobs that recovery completed.
    pub rolled_forward: usize,
    /// `_SUCCESS` markers written.
    pub markers: usize,
    /// Wall time.
    pub elapsed: Duration,
}

impl fmt::Display for RunSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(1e-6);
        write!(
            f,
            "job {} run {}: {} records ({} bad) from {} partitions, {:.1} MB in, {:.1} MB out, {} files, {} _SUCCESS markers in {:.2}s ({:.0} records/s, {:.1} MB/s); ",
            self.job,
            self.run_id,
            self.records,
            self.bad_records,
            self.partitions,
            self.bytes_in as f64 / 1e6,
            self.bytes_out as f64 / 1e6,
            self.files,
            self.markers,
            secs,
            (self.records + self.bad_records) as f64 / secs,
            self.bytes_in as f64 / 1e6 / secs,
        )?;
        match self.committed_seq {
            Some(seq) => write!(f, "committed state {seq}")?,
            None => write!(f, "nothing new to commit")?,
        }
        if self.rolled_back + self.rolled_forward > 0 {
            write!(f, " (recovered earlier runs: {} rolled back, {} completed)", self.rolled_back, self.rolled_forward)?;
        }
        Ok(())
    }
}

fn crash(config: &LoaderConfig, step: Step) -> Result<()> {
    match &config.crash_hook {
        Some(hook) if hook(&step) => Err(Error::InjectedCrash(step)),
        _ => Ok(()),
    }
}

fn valid_job_name(job: &str) -> bool {
    !job.is_empty() && job != "." && job != ".." && job.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Runs the job once: recovery, read, write, commit. `Ok` means everything read is
/// committed (or there was nothing to read).
pub async fn run_once(config: &LoaderConfig, progress: &dyn Progress) -> Result<RunSummary> {
    let started = Instant::now();
    if !valid_job_name(&config.job) {
        return Err(Error::BadJobName(config.job.clone()));
    }
    let pattern = regex::Regex::new(&format!("^(?:{})$", config.topics))?;
    let dest = crate::fs::open(&config.dest, config.hdfs_timeout)?;
    let registry = config.registry.as_deref().map(RegistryClient::new).transpose().map_err(|e| Error::Registry(Box::new(e)))?;
    let run_id = format!("{}-{}", fjord_record::now_ms(), std::process::id());
    let mut summary = RunSummary { job: config.job.clone(), run_id: run_id.clone(), ..RunSummary::default() };

    // 1. Finish or roll back what dead runs left, then read the committed state.
    let (rolled_back, rolled_forward) = commit::recover(&dest, config).await?;
    summary.rolled_back = rolled_back;
    summary.rolled_forward = rolled_forward;
    let state = load_state(&dest, &config.job).await?;
    // Markers of the newest state may be missing if its run died right after committing.
    summary.markers += commit::write_markers(&dest, &state).await?;

    // 2. The partitions and where each read starts and ends.
    let client = ClientConfig {
        allow_auto_create_topics: false,
        security: config.security.clone(),
        ..ClientConfig::new(&config.bootstrap)
    };
    let admin = Admin::connect(client.clone()).await?;
    let partitions = plan::partitions(&admin, &pattern).await?;
    let (earliest, ends) = plan::bounds(&admin, &partitions, config.until).await?;
    let mut parts = plan::plan(&partitions, &earliest, &ends, &state, config.until)?;

    // 3. Read and write.
    let run_dir = format!("{}/{run_id}", crate::layout::tmp_dir(&config.job));
    let mut writer = write::RunWriter::new(&dest, config, run_dir.clone(), registry.as_ref());
    let mut audit_pending = config.audit.as_ref().map(|a| a.pending());
    write::read_and_write(config, client, &mut parts, &mut writer, audit_pending.as_mut(), progress, &mut summary).await?;
    crash(config, Step::FilesWritten)?;
    summary.files = writer.moves.len();
    summary.bytes_out = writer.bytes_out;
    for p in &parts {
        summary.records += p.records;
        summary.bad_records += p.bad_records;
    }
    if summary.records + summary.bad_records == 0 {
        summary.elapsed = started.elapsed();
        return Ok(summary);
    }

    // 4. Commit: state and manifest into the run dir, then the moves, then the state.
    let next = commit::next_state(&state, &run_id, &parts);
    commit::commit(&dest, config, &run_dir, &state, &next, std::mem::take(&mut writer.moves)).await?;
    summary.committed_seq = Some(next.seq);
    if let (Some(audit), Some(pending)) = (&config.audit, audit_pending.take()) {
        // Counted only now that the data is committed; a failed publish keeps the counts
        // in the counter, and the next run's publish retries them under the same ids.
        audit.commit(pending);
        publish_audit(audit, config).await;
    }
    summary.markers += commit::write_markers(&dest, &next).await?;
    commit::prune_states(&dest, &config.job, next.seq).await?;
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// Publishes the loader tier's committed counts; failures are logged, not fatal: the
/// data is committed already and the counts stay queued for the next publish.
async fn publish_audit(audit: &fjord_audit::AuditCounter, config: &LoaderConfig) {
    let client = ClientConfig { security: config.security.clone(), ..ClientConfig::new(&config.bootstrap) };
    if let Err(e) = fjord_audit::ensure_audit_topic(&client).await {
        tracing::warn!(error = %e, "could not create the audit topic; relying on auto-creation");
    }
    let producer = match fjord_client::Producer::connect(fjord_client::ProducerConfig { client, ..Default::default() }).await {
        Ok(producer) => producer,
        Err(e) => return tracing::warn!(error = %e, "loader audit counts not published; retried at the next publish"),
    };
    if let Err(e) = audit.publish(&producer).await {
        tracing::warn!(error = %e, "loader audit counts not published; retried at the next publish");
    }
    producer.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_names() {
        for ok in ["nightly", "a.b_c-1"] {
            assert!(valid_job_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a b"] {
            assert!(!valid_job_name(bad), "{bad}");
        }
    }
}
