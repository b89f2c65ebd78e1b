//! One run of a load job: recover what a previous run left, read every matching partition
//! from its committed offset to the end offset fixed at the start, write hourly Avro
//! files into the run's tmp directory, then commit (see the crate docs for the protocol).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apache_avro::Schema;
use base64::Engine;
use bytes::Bytes;
use fjord_client::{
    Admin, ClientConfig, Consumer, ConsumerConfig, ConsumerRecord, OffsetReset, OffsetSpec, SeekTo, TopicPartition,
};
use fjord_schema_registry::RegistryClient;
use serde::{Deserialize, Serialize};

use crate::fs::{Destination, FileWriter};
use crate::layout::{self, HOUR_MS};
use crate::ocf::{self, Codec, OcfWriter};
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

/// A committed state: the job's offsets and counts, one file per commit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobState {
    /// Commit number, 1 for the first.
    pub seq: u64,
    /// The run that committed it.
    pub run_id: String,
    /// topic → partition → next offset to read.
    pub offsets: BTreeMap<String, BTreeMap<i32, i64>>,
    /// topic → partition → largest record timestamp loaded so far.
    pub max_timestamps: BTreeMap<String, BTreeMap<i32, i64>>,
    /// topic → `YYYY/MM/DD/HH` → records loaded into that hour, all runs.
    pub counts: BTreeMap<String, BTreeMap<String, u64>>,
    /// topic → `YYYY/MM/DD/HH` → records this run loaded into that hour.
    pub run_counts: BTreeMap<String, BTreeMap<String, u64>>,
    /// topic → records this run quarantined.
    pub run_bad_records: BTreeMap<String, u64>,
    /// topic → the completeness watermark of the previous state (see [`JobState::watermark`]).
    pub prev_watermarks: BTreeMap<String, i64>,
}

impl JobState {
    /// The time before which a topic's hours are complete: the smallest, over the topic's
    /// partitions that ever had records, of the largest timestamp loaded. Producers' create
    /// times grow within a partition, so no partition will add to an hour that ended
    /// before it. A partition that never had a record does not hold hours back.
    pub fn watermark(&self, topic: &str) -> Option<i64> {
        self.max_timestamps.get(topic).and_then(|m| m.values().min().copied())
    }

    /// Hours whose `_SUCCESS` marker this state asks for and earlier states did not: hours
    /// that became complete since the previous state, and complete hours this run added to.
    pub fn new_complete_hours(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (topic, hours) in &self.counts {
            let Some(wm) = self.watermark(topic) else { continue };
            let prev = self.prev_watermarks.get(topic).copied();
            let touched = self.run_counts.get(topic);
            for hour in hours.keys() {
                let Some(start) = layout::parse_hour_path(hour) else { continue };
                let end = start + HOUR_MS;
                let newly = prev.is_none_or(|p| end > p) || touched.is_some_and(|t| t.contains_key(hour));
                if end <= wm && newly {
                    out.push((topic.clone(), hour.clone()));
                }
            }
        }
        out
    }
}

/// The run's point of no return: what to move and the state to install.
#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    run_id: String,
    prev_seq: u64,
    /// (path in the run dir, final path), both relative to the destination root.
    moves: Vec<(String, String)>,
}

const MANIFEST: &str = "_MANIFEST.json";
const STATE_IN_RUN: &str = "offsets.json";
/// Committed states kept besides the newest (older ones are deleted after a commit).
const STATES_KEPT: u64 = 20;

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
    let (rolled_back, rolled_forward) = recover(&dest, config).await?;
    summary.rolled_back = rolled_back;
    summary.rolled_forward = rolled_forward;
    let state = load_state(&dest, &config.job).await?;
    // Markers of the newest state may be missing if its run died right after committing.
    summary.markers += write_markers(&dest, &state).await?;

    // 2. The partitions and where each read starts and ends.
    let client = ClientConfig {
        allow_auto_create_topics: false,
        security: config.security.clone(),
        ..ClientConfig::new(&config.bootstrap)
    };
    let admin = Admin::connect(client.clone()).await?;
    let mut topics: Vec<_> =
        admin.list_topics().await?.into_iter().filter(|t| !t.is_internal && pattern.is_match(&t.name)).collect();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    let tps: Vec<(String, i32)> =
        topics.iter().flat_map(|t| t.partitions.iter().map(|p| (t.name.clone(), p.partition))).collect();
    let ask = |spec: OffsetSpec| tps.iter().map(|(t, p)| (t.clone(), *p, spec)).collect::<Vec<_>>();
    let earliest = admin.list_offsets(&ask(OffsetSpec::Earliest)).await?;
    let mut ends = admin.list_offsets(&ask(OffsetSpec::Latest)).await?;
    if let Until::Timestamp(ts) = config.until {
        let at = admin.list_offsets(&ask(OffsetSpec::Timestamp(ts))).await?;
        for (end, at) in ends.iter_mut().zip(at) {
            *end = (*end).min(at);
        }
    }
    let mut parts: Vec<PartitionRun> = Vec::new();
    for (i, (topic, partition)) in tps.iter().enumerate() {
        let committed = state.offsets.get(topic).and_then(|m| m.get(partition)).copied();
        let mut start = committed.unwrap_or(earliest[i]);
        if start < earliest[i] {
            tracing::warn!(
                topic,
                partition,
                committed = start,
                log_start = earliest[i],
                "records before the log start were deleted by retention before they were loaded"
            );
            start = earliest[i];
        }
        if start > ends[i] && config.until == Until::Latest {
            return Err(Error::Inconsistent(format!(
                "{topic}-{partition}: committed offset {start} is beyond the log end {} (topic recreated?)",
                ends[i]
            )));
        }
        parts.push(PartitionRun::new(topic, *partition, start, ends[i]));
    }

    // 3. Read and write.
    let run_dir = format!("{}/{run_id}", layout::tmp_dir(&config.job));
    let mut writer = RunWriter {
        dest: &dest,
        config,
        run_dir: run_dir.clone(),
        registry: registry.as_ref(),
        schemas: HashMap::new(),
        refused: HashMap::new(),
        moves: Vec::new(),
        next_file: 0,
        bytes_out: 0,
        scratch: Vec::new(),
    };
    let mut audit_pending = config.audit.as_ref().map(|a| a.pending());
    let mut remaining: Vec<usize> = (0..parts.len()).filter(|&i| parts[i].next < parts[i].end).collect();
    progress.start(remaining.len(), remaining.iter().map(|&i| (parts[i].end - parts[i].next) as u64).sum());
    summary.partitions = remaining.len();
    if !remaining.is_empty() {
        let mut consumer = Consumer::connect(ConsumerConfig {
            client,
            auto_offset_reset: OffsetReset::Earliest,
            fetch_max_wait: Duration::from_millis(100),
            // A bulk reader: large fetches, and room for a producer's whole batch (1 MB in
            // librdkafka) per partition.
            max_partition_fetch_bytes: 8 * 1024 * 1024,
            fetch_max_bytes: 64 * 1024 * 1024,
            ..ConsumerConfig::default()
        })
        .await?;
        assign(&mut consumer, &parts, &remaining).await?;
        let index: HashMap<(String, i32), usize> =
            parts.iter().enumerate().map(|(i, p)| ((p.topic.clone(), p.partition), i)).collect();
        let mut taken = 0u64;
        while !remaining.is_empty() {
            // recv, not poll(timeout): a poll timing out in the middle of decoding a fetch
            // response drops it, and with large responses that repeats (fjord-client issue).
            // The idle bound here ends the run, so dropping state on it is harmless.
            let record = match tokio::time::timeout(config.idle_timeout, consumer.recv()).await {
                Ok(record) => record?,
                Err(_) => {
                    let p = &parts[remaining[0]];
                    return Err(Error::Stalled {
                        topic: p.topic.clone(),
                        partition: p.partition,
                        offset: p.next,
                        end: p.end,
                        idle: config.idle_timeout,
                    });
                }
            };
            let Some(&i) = index.get(&(record.topic.to_string(), record.partition)) else { continue };
            let part = &mut parts[i];
            if record.offset < part.next || record.offset >= part.end {
                continue;
            }
            taken += 1;
            let bytes = record.key.as_ref().map_or(0, |k| k.len() as u64) + record.value.as_ref().map_or(0, |v| v.len() as u64);
            let bad_before = part.bad_records;
            writer.take(part, &record).await?;
            if part.bad_records == bad_before {
                if let Some(pending) = audit_pending.as_mut() {
                    pending.record_consumed(&record);
                }
            }
            crash(config, Step::Read(taken))?;
            summary.bytes_in += bytes;
            progress.advance(1, bytes);
            let capped = config.max_records.is_some_and(|max| taken >= max);
            if capped {
                // Cap reached: every partition ends where it is now.
                for p in parts.iter_mut() {
                    p.end = p.end.min(p.next);
                }
            }
            if parts[i].next < parts[i].end && !capped {
                continue;
            }
            for &j in &remaining {
                if parts[j].next >= parts[j].end {
                    writer.finish_partition(&mut parts[j]).await?;
                    progress.partition_done();
                }
            }
            // Finished partitions stay assigned (their records are skipped above): a new
            // assignment can take in a response to an old fetch that ran ahead of the
            // position, which would skip records (fjord-client: the seek epoch restarts).
            remaining.retain(|&j| parts[j].next < parts[j].end);
        }
    }
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
    let mut next = state.clone();
    next.seq = state.seq + 1;
    next.run_id = run_id.clone();
    next.run_counts.clear();
    next.run_bad_records.clear();
    next.prev_watermarks = state.counts.keys().filter_map(|t| state.watermark(t).map(|w| (t.clone(), w))).collect();
    for p in &parts {
        if p.records + p.bad_records == 0 {
            continue;
        }
        next.offsets.entry(p.topic.clone()).or_default().insert(p.partition, p.next);
        if let Some(ts) = p.max_timestamp {
            let m = next.max_timestamps.entry(p.topic.clone()).or_default().entry(p.partition).or_insert(ts);
            *m = (*m).max(ts);
        }
        for (hour, n) in &p.counts {
            *next.counts.entry(p.topic.clone()).or_default().entry(hour.clone()).or_default() += n;
            *next.run_counts.entry(p.topic.clone()).or_default().entry(hour.clone()).or_default() += n;
        }
        if p.bad_records > 0 {
            *next.run_bad_records.entry(p.topic.clone()).or_default() += p.bad_records;
        }
    }
    let state_json = serde_json::to_vec_pretty(&next).expect("invariant: state serializes");
    write_whole(&dest, &format!("{run_dir}/{STATE_IN_RUN}"), state_json).await?;
    let manifest = Manifest { run_id: run_id.clone(), prev_seq: state.seq, moves: std::mem::take(&mut writer.moves) };
    let manifest_json = serde_json::to_vec_pretty(&manifest).expect("invariant: manifest serializes");
    let part = format!("{run_dir}/{MANIFEST}.part");
    write_whole(&dest, &part, manifest_json).await?;
    dest.fs.rename(&dest.path(&part), &dest.path(&format!("{run_dir}/{MANIFEST}"))).await?;
    crash(config, Step::ManifestWritten)?;
    complete(&dest, config, &run_dir, &manifest, next.seq, false).await?;
    summary.committed_seq = Some(next.seq);
    if let (Some(audit), Some(pending)) = (&config.audit, audit_pending.take()) {
        // Counted only now that the data is committed; a failed publish keeps the counts
        // in the counter, and the next run's publish retries them under the same ids.
        audit.commit(pending);
        publish_audit(audit, config).await;
    }
    summary.markers += write_markers(&dest, &next).await?;
    prune_states(&dest, &config.job, next.seq).await?;
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

/// Assigns the partitions with records to read, each at its start offset.
async fn assign(consumer: &mut Consumer, parts: &[PartitionRun], which: &[usize]) -> Result<()> {
    consumer.assign(which.iter().map(|&i| TopicPartition::new(parts[i].topic.as_str(), parts[i].partition))).await?;
    for &i in which {
        consumer.seek(&TopicPartition::new(parts[i].topic.as_str(), parts[i].partition), SeekTo::Offset(parts[i].next))?;
    }
    Ok(())
}

async fn write_whole(dest: &Destination, rel: &str, data: Vec<u8>) -> Result<()> {
    let mut w = dest.fs.create(&dest.path(rel)).await?;
    w.write(Bytes::from(data)).await?;
    w.close().await
}

fn parent(rel: &str) -> &str {
    rel.rsplit_once('/').map_or("", |(p, _)| p)
}

/// Moves the manifest's files into place, installs the state (the commit) and deletes the
/// run directory. Each step is skipped when already done, so a run that died anywhere in
/// here is finished by calling this again.
async fn complete(
    dest: &Destination,
    config: &LoaderConfig,
    run_dir: &str,
    manifest: &Manifest,
    seq: u64,
    recovery: bool,
) -> Result<()> {
    for (index, (from, to)) in manifest.moves.iter().enumerate() {
        let (from_abs, to_abs) = (dest.path(from), dest.path(to));
        if dest.fs.exists(&from_abs).await? {
            dest.fs.mkdirs(&dest.path(parent(to))).await?;
            dest.fs.rename(&from_abs, &to_abs).await?;
        } else if !dest.fs.exists(&to_abs).await? {
            return Err(Error::Inconsistent(format!(
                "{from} of run {} is neither in its run directory nor at {to}",
                manifest.run_id
            )));
        }
        crash(config, Step::Moved { index, recovery })?;
    }
    let state_rel = layout::state_file(&config.job, seq);
    if !dest.fs.exists(&dest.path(&state_rel)).await? {
        dest.fs.mkdirs(&dest.path(&layout::offsets_dir(&config.job))).await?;
        dest.fs.rename(&dest.path(&format!("{run_dir}/{STATE_IN_RUN}")), &dest.path(&state_rel)).await?;
    }
    crash(config, Step::StateInstalled)?;
    dest.fs.delete(&dest.path(run_dir), true).await?;
    Ok(())
}

/// Deals with the run directories of dead runs: without a manifest a run committed
/// nothing and none of its files are visible, so it is deleted; with one, it is finished.
/// Returns (rolled back, rolled forward).
async fn recover(dest: &Destination, config: &LoaderConfig) -> Result<(usize, usize)> {
    let tmp = layout::tmp_dir(&config.job);
    let runs = match dest.fs.list(&dest.path(&tmp)).await {
        Ok(runs) => runs,
        Err(Error::NotFound(_)) => return Ok((0, 0)),
        Err(e) => return Err(e),
    };
    let (mut back, mut forward) = (0, 0);
    for run in runs.iter().filter(|e| e.is_dir) {
        let run_dir = format!("{tmp}/{}", run.name);
        let manifest_path = dest.path(&format!("{run_dir}/{MANIFEST}"));
        if !dest.fs.exists(&manifest_path).await? {
            tracing::info!(run = %run.name, job = %config.job, "rolling back a run that died before its manifest");
            dest.fs.delete(&dest.path(&run_dir), true).await?;
            back += 1;
            continue;
        }
        let manifest: Manifest = serde_json::from_slice(&dest.fs.read(&manifest_path).await?)
            .map_err(|source| Error::CorruptState { path: manifest_path.clone(), source })?;
        let seq = manifest.prev_seq + 1;
        let latest = latest_seq(dest, &config.job).await?;
        if latest >= seq {
            // Committed already: only the cleanup was missing.
            dest.fs.delete(&dest.path(&run_dir), true).await?;
            continue;
        }
        if latest != manifest.prev_seq {
            return Err(Error::Inconsistent(format!(
                "run {} was based on state {} but the newest state is {latest}",
                manifest.run_id, manifest.prev_seq
            )));
        }
        tracing::info!(run = %run.name, job = %config.job, moves = manifest.moves.len(), "completing a run that died after its manifest");
        complete(dest, config, &run_dir, &manifest, seq, true).await?;
        forward += 1;
    }
    Ok((back, forward))
}

async fn state_seqs(dest: &Destination, job: &str) -> Result<Vec<u64>> {
    match dest.fs.list(&dest.path(&layout::offsets_dir(job))).await {
        Ok(entries) => Ok(entries.iter().filter_map(|e| e.name.strip_suffix(".json")?.parse().ok()).collect()),
        Err(Error::NotFound(_)) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

async fn latest_seq(dest: &Destination, job: &str) -> Result<u64> {
    Ok(state_seqs(dest, job).await?.into_iter().max().unwrap_or(0))
}

/// The newest committed state of `job` in `dest` (an empty state before the first commit).
pub async fn load_state(dest: &Destination, job: &str) -> Result<JobState> {
    let seq = latest_seq(dest, job).await?;
    if seq == 0 {
        return Ok(JobState::default());
    }
    let path = dest.path(&layout::state_file(job, seq));
    serde_json::from_slice(&dest.fs.read(&path).await?).map_err(|source| Error::CorruptState { path, source })
}

async fn prune_states(dest: &Destination, job: &str, newest: u64) -> Result<()> {
    for seq in state_seqs(dest, job).await? {
        if seq + STATES_KEPT < newest {
            dest.fs.delete(&dest.path(&layout::state_file(job, seq)), false).await?;
        }
    }
    Ok(())
}

/// Writes the `_SUCCESS` markers `state` asks for that are missing; returns how many.
async fn write_markers(dest: &Destination, state: &JobState) -> Result<usize> {
    let mut written = 0;
    for (topic, hour) in state.new_complete_hours() {
        let path = dest.path(&format!("{}/_SUCCESS", layout::hour_dir(&topic, &hour)));
        if !dest.fs.exists(&path).await? {
            match dest.fs.create(&path).await {
                Ok(w) => w.close().await?,
                Err(Error::AlreadyExists(_)) => continue,
                Err(e) => return Err(e),
            }
            written += 1;
        }
    }
    Ok(written)
}

/// What a data file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Envelope,
    Registered(i32),
}

struct OpenFile {
    ocf: OcfWriter,
    kind: Kind,
    hour: i64,
    first: i64,
    last: i64,
    tmp: String,
}

struct ErrorFile {
    out: Box<dyn FileWriter>,
    first: i64,
    last: i64,
    tmp: String,
}

/// One partition's progress in a run.
struct PartitionRun {
    topic: String,
    partition: i32,
    next: i64,
    end: i64,
    records: u64,
    bad_records: u64,
    max_timestamp: Option<i64>,
    counts: BTreeMap<String, u64>,
    file: Option<OpenFile>,
    errors: Option<ErrorFile>,
}

impl PartitionRun {
    fn new(topic: &str, partition: i32, next: i64, end: i64) -> Self {
        Self {
            topic: topic.to_string(),
            partition,
            next,
            end,
            records: 0,
            bad_records: 0,
            max_timestamp: None,
            counts: BTreeMap::new(),
            file: None,
            errors: None,
        }
    }
}

/// Turns records into files in the run directory and remembers where they go.
struct RunWriter<'a> {
    dest: &'a Destination,
    config: &'a LoaderConfig,
    run_dir: String,
    registry: Option<&'a RegistryClient>,
    /// Schema id → (schema, its JSON for file headers).
    schemas: HashMap<i32, (Arc<Schema>, String)>,
    /// Schema ids the registry has but this loader refuses, with the reason.
    refused: HashMap<i32, String>,
    moves: Vec<(String, String)>,
    next_file: u64,
    bytes_out: u64,
    scratch: Vec<u8>,
}

/// Why a record is bad (it goes to the errors directory).
struct Bad(String);

impl RunWriter<'_> {
    fn tmp_name(&mut self, ext: &str) -> String {
        self.next_file += 1;
        format!("{}/files/{:08}.{ext}", self.run_dir, self.next_file)
    }

    /// The kind of file a record goes into and its datum in `self.scratch`.
    async fn encode(&mut self, part: &PartitionRun, r: &ConsumerRecord) -> Result<Result<Kind, Bad>> {
        self.scratch.clear();
        let framed = r
            .value
            .as_deref()
            .filter(|v| v.len() >= fjord_schema_registry::framing::HEADER_LEN && v[0] == fjord_schema_registry::framing::MAGIC);
        let (Some(registry), Some(value)) = (self.registry, framed) else {
            ocf::encode_envelope(
                &mut self.scratch,
                part.partition,
                r.offset,
                r.timestamp,
                r.key.as_deref(),
                r.value.as_deref(),
                &r.headers,
            );
            return Ok(Ok(Kind::Envelope));
        };
        let (id, datum) = fjord_schema_registry::framing::unframe(value).map_err(|e| Error::Registry(Box::new(e)))?;
        if let Some(reason) = self.refused.get(&id) {
            return Ok(Err(Bad(reason.clone())));
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = self.schemas.entry(id) {
            use fjord_schema_registry::Error as E;
            let schema = match registry.schema(id).await {
                Ok(s) => s,
                Err(E::UnknownId(_)) => return Ok(Err(Bad(format!("schema id {id} is not registered")))),
                // A schema the registry holds but this loader will not decode with (one
                // beyond the limits, registered before they were enforced): every record
                // naming it is bad, and the run goes on. Remembered, so it is fetched once.
                Err(e @ (E::SchemaLimit { .. } | E::InvalidSchema(_) | E::UnsupportedSchema(_))) => {
                    let reason = format!("schema id {id} is refused: {e}");
                    self.refused.insert(id, reason.clone());
                    return Ok(Err(Bad(reason)));
                }
                Err(e) => return Err(Error::Registry(Box::new(e))),
            };
            let json =
                serde_json::to_string(&*schema).map_err(|source| Error::CorruptState { path: format!("schema {id}"), source })?;
            slot.insert((schema, json));
        }
        let schema = &self.schemas[&id].0;
        // Bounded: every length, size and count is checked against the bytes left before
        // anything is allocated (a `fixed` of 2^62 once aborted every run here).
        match fjord_schema_registry::datum::decode(schema, None, datum, id, registry.datum_limits()) {
            Ok(_) => {}
            Err(fjord_schema_registry::Error::TrailingBytes { len, .. }) => {
                return Ok(Err(Bad(format!("{len} bytes left after the datum of schema {id}"))))
            }
            Err(e) => return Ok(Err(Bad(format!("does not decode with schema {id}: {e}")))),
        }
        self.scratch.extend_from_slice(datum);
        Ok(Ok(Kind::Registered(id)))
    }

    async fn take(&mut self, part: &mut PartitionRun, r: &ConsumerRecord) -> Result<()> {
        part.next = r.offset + 1;
        match self.encode(part, r).await? {
            Ok(kind) => {
                let hour = layout::hour_of(r.timestamp);
                let roll = part.file.as_ref().is_some_and(|f| {
                    f.kind != kind || f.hour != hour || f.ocf.written + f.ocf.pending() >= self.config.max_file_bytes
                });
                if roll {
                    self.close_file(part).await?;
                }
                if part.file.is_none() {
                    part.file = Some(self.open_file(part, kind, hour, r.offset).await?);
                }
                let file = part.file.as_mut().expect("invariant: opened above");
                file.ocf.append(&self.scratch).await?;
                file.last = r.offset;
                part.records += 1;
                *part.counts.entry(layout::hour_path(r.timestamp)).or_default() += 1;
                part.max_timestamp = Some(part.max_timestamp.map_or(r.timestamp, |m| m.max(r.timestamp)));
            }
            Err(Bad(reason)) => {
                if self.config.on_bad_record == BadRecordPolicy::Fail {
                    return Err(Error::BadRecord {
                        topic: part.topic.clone(),
                        partition: part.partition,
                        offset: r.offset,
                        reason,
                    });
                }
                self.quarantine(part, r, reason).await?;
            }
        }
        Ok(())
    }

    async fn open_file(&mut self, part: &PartitionRun, kind: Kind, hour: i64, first: i64) -> Result<OpenFile> {
        let tmp = self.tmp_name("avro");
        let schema_json = match kind {
            Kind::Envelope => ocf::ENVELOPE_SCHEMA,
            Kind::Registered(id) => self.schemas[&id].1.as_str(),
        };
        let mut meta = vec![("fjord.topic", part.topic.clone()), ("fjord.partition", part.partition.to_string())];
        if let Kind::Registered(id) = kind {
            meta.push(("fjord.schema.id", id.to_string()));
        }
        let out = self.dest.fs.create(&self.dest.path(&tmp)).await?;
        let ocf = OcfWriter::start(out, &tmp, schema_json, self.config.codec, &meta).await?;
        Ok(OpenFile { ocf, kind, hour, first, last: first, tmp })
    }

    async fn close_file(&mut self, part: &mut PartitionRun) -> Result<()> {
        if let Some(f) = part.file.take() {
            self.bytes_out += f.ocf.finish().await?;
            let dir = layout::hour_dir(&part.topic, &layout::hour_path(f.hour));
            self.moves.push((f.tmp, format!("{dir}/{}", layout::data_file_name(&part.topic, part.partition, f.first, f.last))));
        }
        Ok(())
    }

    async fn quarantine(&mut self, part: &mut PartitionRun, r: &ConsumerRecord, reason: String) -> Result<()> {
        if part.errors.is_none() {
            let tmp = self.tmp_name("jsonl");
            let out = self.dest.fs.create(&self.dest.path(&tmp)).await?;
            part.errors = Some(ErrorFile { out, first: r.offset, last: r.offset, tmp });
        }
        let b64 = |b: &Option<Bytes>| b.as_ref().map(|b| base64::engine::general_purpose::STANDARD.encode(b));
        let line = serde_json::json!({
            "topic": part.topic, "partition": part.partition, "offset": r.offset, "timestamp": r.timestamp,
            "reason": reason, "key": b64(&r.key), "value": b64(&r.value),
        });
        let mut bytes = serde_json::to_vec(&line).expect("invariant: JSON values serialize");
        bytes.push(b'\n');
        self.bytes_out += bytes.len() as u64;
        let errors = part.errors.as_mut().expect("invariant: opened above");
        errors.last = r.offset;
        errors.out.write(Bytes::from(bytes)).await?;
        part.bad_records += 1;
        Ok(())
    }

    async fn finish_partition(&mut self, part: &mut PartitionRun) -> Result<()> {
        self.close_file(part).await?;
        if let Some(e) = part.errors.take() {
            e.out.close().await?;
            self.moves.push((e.tmp, layout::error_file(&self.config.job, &part.topic, part.partition, e.first, e.last)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_hours_follow_the_slowest_partition() {
        let h = |n: i64| layout::hour_path(n * HOUR_MS);
        let mut s = JobState::default();
        s.counts.insert("t".into(), [(h(0), 5), (h(1), 5), (h(2), 5)].into_iter().collect());
        // Partition 1 has only reached the middle of hour 1.
        s.max_timestamps.insert("t".into(), [(0, 3 * HOUR_MS), (1, HOUR_MS + HOUR_MS / 2)].into_iter().collect());
        assert_eq!(s.watermark("t"), Some(HOUR_MS + HOUR_MS / 2));
        assert_eq!(s.new_complete_hours(), vec![("t".to_string(), h(0))]);
        // Hour 0 was complete before and this run did not touch it: nothing new.
        s.prev_watermarks.insert("t".into(), HOUR_MS);
        assert!(s.new_complete_hours().is_empty());
        // A late record for hour 0 in this run asks for its marker again.
        s.run_counts.insert("t".into(), [(h(0), 1)].into_iter().collect());
        assert_eq!(s.new_complete_hours(), vec![("t".to_string(), h(0))]);
    }

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
