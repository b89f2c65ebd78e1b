//! Committing a run (the crate docs give the protocol): the committed state
//! ([`JobState`]) and the next one a run commits ([`next_state`], a pure function of the
//! previous state and what the run read), the manifest, the moves into the final layout,
//! the install of the state, recovery of the runs that died, and the `_SUCCESS` markers.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::write::PartitionRun;
use super::{crash, LoaderConfig, Step};
use crate::fs::Destination;
use crate::layout::{self, HOUR_MS};
use crate::{Error, Result};

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

/// The state a run commits after `state`: its offsets (each partition read, the next
/// offset to read), largest timestamps and hour counts added to the previous ones, this
/// run's own counts and bad records, and the previous state's watermarks (for the
/// `_SUCCESS` markers). Partitions the run took nothing from keep what `state` says.
pub(super) fn next_state(state: &JobState, run_id: &str, parts: &[PartitionRun]) -> JobState {
    let mut next = state.clone();
    next.seq = state.seq + 1;
    next.run_id = run_id.to_string();
    next.run_counts.clear();
    next.run_bad_records.clear();
    next.prev_watermarks = state.counts.keys().filter_map(|t| state.watermark(t).map(|w| (t.clone(), w))).collect();
    for p in parts {
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
    next
}

/// Commits the run in `run_dir` that read from `state`: writes `next` and the manifest of
/// `moves` into the run directory (the manifest whole or not at all: the point of no
/// return), then [`complete`]s it.
pub(super) async fn commit(
    dest: &Destination,
    config: &LoaderConfig,
    run_dir: &str,
    state: &JobState,
    next: &JobState,
    moves: Vec<(String, String)>,
) -> Result<()> {
    let state_json = serde_json::to_vec_pretty(next).expect("invariant: state serializes");
    write_whole(dest, &format!("{run_dir}/{STATE_IN_RUN}"), state_json).await?;
    let manifest = Manifest { run_id: next.run_id.clone(), prev_seq: state.seq, moves };
    let manifest_json = serde_json::to_vec_pretty(&manifest).expect("invariant: manifest serializes");
    let part = format!("{run_dir}/{MANIFEST}.part");
    write_whole(dest, &part, manifest_json).await?;
    dest.fs.rename(&dest.path(&part), &dest.path(&format!("{run_dir}/{MANIFEST}"))).await?;
    crash(config, Step::ManifestWritten)?;
    complete(dest, config, run_dir, &manifest, next.seq, false).await
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
pub(super) async fn recover(dest: &Destination, config: &LoaderConfig) -> Result<(usize, usize)> {
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

pub(super) async fn prune_states(dest: &Destination, job: &str, newest: u64) -> Result<()> {
    for seq in state_seqs(dest, job).await? {
        if seq + STATES_KEPT < newest {
            dest.fs.delete(&dest.path(&layout::state_file(job, seq)), false).await?;
        }
    }
    Ok(())
}

/// Writes the `_SUCCESS` markers `state` asks for that are missing; returns how many.
pub(super) async fn write_markers(dest: &Destination, state: &JobState) -> Result<usize> {
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
    fn the_next_state_adds_what_the_run_read_to_the_previous_one() {
        let h = |n: i64| layout::hour_path(n * HOUR_MS);
        let mut state = JobState { seq: 4, run_id: "before".into(), ..JobState::default() };
        state.offsets.insert("t".into(), [(0, 10), (1, 7)].into_iter().collect());
        state.max_timestamps.insert("t".into(), [(0, 2 * HOUR_MS), (1, HOUR_MS)].into_iter().collect());
        state.counts.insert("t".into(), [(h(0), 17)].into_iter().collect());
        state.run_counts.insert("t".into(), [(h(0), 17)].into_iter().collect());
        state.run_bad_records.insert("t".into(), 3);
        // This run: t-0 took 5 records into hour 2 and quarantined 1; t-1 took nothing.
        let mut read = PartitionRun::new("t", 0, 10, 16);
        read.next = 16;
        read.records = 5;
        read.bad_records = 1;
        read.max_timestamp = Some(2 * HOUR_MS + 5);
        read.counts.insert(h(2), 5);
        let idle = PartitionRun::new("t", 1, 7, 7);

        let next = next_state(&state, "now", &[read, idle]);
        assert_eq!((next.seq, next.run_id.as_str()), (5, "now"));
        assert_eq!(next.offsets["t"], [(0, 16), (1, 7)].into_iter().collect());
        assert_eq!(next.max_timestamps["t"], [(0, 2 * HOUR_MS + 5), (1, HOUR_MS)].into_iter().collect());
        assert_eq!(next.counts["t"], [(h(0), 17), (h(2), 5)].into_iter().collect());
        assert_eq!(next.run_counts["t"], [(h(2), 5)].into_iter().collect(), "this run's counts only");
        assert_eq!(next.run_bad_records["t"], 1);
        assert_eq!(next.prev_watermarks["t"], HOUR_MS, "the previous state's watermark: its slowest partition");
    }
}
