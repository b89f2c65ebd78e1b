//! `/ui/loads`: the jobs of `fjord load` (the Hadoop loader). The loader keeps no state in
//! the brokers: each commit is a state file beside its data, `<dest>/_fjord/offsets/<job>/
//! <seq>.json` (the newest 20 are kept), holding the next offset per partition and the
//! records the run loaded per hour. So the page reads the destinations the console is
//! configured with (`loads`), and shows per job its committed offsets and its recent
//! commits, each with the files it wrote: the data files in the hours the commit loaded
//! whose offset range (in their names) lies between the previous commit's offsets and
//! its own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Extension;
use fjord_auth::{Operation, Resource};
use fjord_hadoop_loader::fs::Destination;
use fjord_hadoop_loader::job::JobState;
use fjord_hadoop_loader::layout as dest_layout;
use maud::{html, Markup};

use crate::layout::{self, count, error_box, time, Nav};
use crate::{Caller, Console, Error, Result};

/// Commits shown per job, newest first.
const RECENT: usize = 10;

/// One data file a commit wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoadedFile {
    /// Path under the destination root.
    pub(crate) path: String,
    pub(crate) partition: i32,
    pub(crate) first: i64,
    pub(crate) last: i64,
    pub(crate) bytes: u64,
}

/// One commit of a job.
#[derive(Debug, Clone)]
pub(crate) struct Commit {
    pub(crate) state: JobState,
    /// topic → files; `None` when the previous state is pruned (the range is unknown).
    pub(crate) files: Option<BTreeMap<String, Vec<LoadedFile>>>,
}

/// One job: its commits, newest first.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) name: String,
    pub(crate) commits: Vec<Commit>,
}

/// When a run started: its id is `<ms since the epoch>-<pid>`.
pub(crate) fn run_started_ms(run_id: &str) -> Option<i64> {
    run_id.split_once('-').and_then(|(ms, _)| ms.parse().ok())
}

/// Whether data file (`partition`, `first`..=`last`) of `topic` is one `state` committed
/// after `previous`: its range lies in [previous offset, state offset).
pub(crate) fn written_by(state: &JobState, previous: &JobState, topic: &str, partition: i32, first: i64, last: i64) -> bool {
    let from = previous.offsets.get(topic).and_then(|p| p.get(&partition)).copied().unwrap_or(0);
    let to = state.offsets.get(topic).and_then(|p| p.get(&partition)).copied().unwrap_or(0);
    first >= from && last < to
}

fn loader_error(dest: &str, e: fjord_hadoop_loader::Error) -> Error {
    // The loader's messages leave the cause to `source()`: show the chain.
    let mut reason = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        reason.push_str(": ");
        reason.push_str(&c.to_string());
        cause = c.source();
    }
    Error::Loader { dest: dest.to_string(), reason }
}

/// The files `state` wrote (see [`written_by`]), listed from the hours it loaded.
async fn files(
    dest: &Destination,
    state: &JobState,
    previous: &JobState,
) -> fjord_hadoop_loader::Result<BTreeMap<String, Vec<LoadedFile>>> {
    let mut out: BTreeMap<String, Vec<LoadedFile>> = BTreeMap::new();
    for (topic, hours) in &state.run_counts {
        for hour in hours.keys() {
            let dir = dest_layout::hour_dir(topic, hour);
            let entries = match dest.fs.list(&dest.path(&dir)).await {
                Err(fjord_hadoop_loader::Error::NotFound(_)) => continue,
                other => other?,
            };
            for e in entries.into_iter().filter(|e| !e.is_dir) {
                let Some((t, partition, first, last)) = dest_layout::parse_data_file_name(&e.name) else { continue };
                if t == *topic && written_by(state, previous, topic, partition, first, last) {
                    out.entry(topic.clone()).or_default().push(LoadedFile {
                        path: format!("{dir}/{}", e.name),
                        partition,
                        first,
                        last,
                        bytes: e.len,
                    });
                }
            }
        }
    }
    for files in out.values_mut() {
        files.sort_by_key(|f| (f.partition, f.first));
    }
    Ok(out)
}

/// Every job of one destination with its recent commits.
async fn jobs(dest: &Destination) -> fjord_hadoop_loader::Result<Vec<Job>> {
    let root = dest.path("_fjord/offsets");
    let entries = match dest.fs.list(&root).await {
        Err(fjord_hadoop_loader::Error::NotFound(_)) => return Ok(Vec::new()),
        other => other?,
    };
    let mut jobs = Vec::new();
    for job in entries.into_iter().filter(|e| e.is_dir) {
        let dir = dest.path(&dest_layout::offsets_dir(&job.name));
        let mut seqs: Vec<u64> =
            dest.fs.list(&dir).await?.iter().filter_map(|e| e.name.strip_suffix(".json")?.parse().ok()).collect();
        seqs.sort_unstable_by(|a, b| b.cmp(a));
        // One more than shown: the oldest shown needs its predecessor for its files.
        seqs.truncate(RECENT + 1);
        let mut states = Vec::with_capacity(seqs.len());
        for seq in &seqs {
            let path = dest.path(&dest_layout::state_file(&job.name, *seq));
            let state: JobState = serde_json::from_slice(&dest.fs.read(&path).await?)
                .map_err(|source| fjord_hadoop_loader::Error::CorruptState { path, source })?;
            states.push(state);
        }
        let mut commits = Vec::new();
        for (i, state) in states.iter().enumerate().take(RECENT) {
            let previous = match states.get(i + 1) {
                Some(p) if p.seq + 1 == state.seq => Some(p.clone()),
                // The first commit starts from nothing.
                _ if state.seq == 1 => Some(JobState::default()),
                _ => None,
            };
            let files = match previous {
                Some(p) => Some(files(dest, state, &p).await?),
                None => None,
            };
            commits.push(Commit { state: state.clone(), files });
        }
        jobs.push(Job { name: job.name, commits });
    }
    jobs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(jobs)
}

async fn destination(url: &str, timeout: Duration) -> Result<Vec<Job>> {
    let dest = fjord_hadoop_loader::fs::open(url, timeout).map_err(|e| loader_error(url, e))?;
    match tokio::time::timeout(timeout, jobs(&dest)).await {
        Ok(r) => r.map_err(|e| loader_error(url, e)),
        Err(_) => Err(Error::Loader { dest: url.to_string(), reason: format!("no answer within {timeout:?}") }),
    }
}

fn job_section(c: &Console, caller: &Caller, job: &Job) -> Markup {
    let see = |topic: &str| caller.may(c, Operation::Describe, Resource::topic(topic));
    let latest = job.commits.first().map(|c| &c.state);
    html! {
        section.job data-job=(job.name) {
            h3 { "Job " span.name { (job.name) } }
            @match latest {
                None => p { "No commit yet." },
                Some(state) => {
                    p.summary { "Committed state " strong { (state.seq) } " by run " code { (state.run_id) } }
                    table.offsets {
                        thead { tr { th { "topic" } th.num { "partition" } th.num { "next offset" } th { "loaded up to (record time)" } } }
                        tbody {
                            @for (topic, partitions) in state.offsets.iter().filter(|(t, _)| see(t)) {
                                @for (partition, offset) in partitions {
                                    tr {
                                        td { (topic) } td.num { (partition) } td.num.offset { (offset) }
                                        td { (state.max_timestamps.get(topic).and_then(|m| m.get(partition)).map_or("-".into(), |t| time(*t))) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if !job.commits.is_empty() {
                table.commits {
                    thead { tr { th.num { "commit" } th { "run started (UTC)" } th.num { "records" } th.num { "bad records" } th { "files written" } } }
                    tbody {
                        @for commit in &job.commits {
                            @let s = &commit.state;
                            @let records: u64 = s.run_counts.iter().filter(|(t, _)| see(t)).flat_map(|(_, h)| h.values()).sum();
                            @let bad: u64 = s.run_bad_records.iter().filter(|(t, _)| see(t)).map(|(_, n)| *n).sum();
                            tr.(if bad > 0 { "warn" } else { "" }) {
                                td.num { (s.seq) }
                                td { (run_started_ms(&s.run_id).map_or_else(|| s.run_id.clone(), time)) }
                                td.num { (count(records as i64)) }
                                td.num { (bad) }
                                td {
                                    @match &commit.files {
                                        None => span.hint { "unknown (the previous state is pruned)" },
                                        Some(files) => {
                                            @let shown: Vec<&LoadedFile> = files.iter().filter(|(t, _)| see(t)).flat_map(|(_, f)| f).collect();
                                            @if shown.is_empty() { span.hint { "none" } }
                                            ul.files {
                                                @for f in shown {
                                                    li { code { (f.path) } " · partition " (f.partition) ", offsets " (f.first) "–" (f.last) ", " (count(f.bytes as i64)) " bytes" }
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub(crate) async fn page(State(c): State<Arc<Console>>, Extension(caller): Extension<Caller>) -> Result<Markup> {
    let read = c.config.loads.iter().map(|url| destination(url, c.config.timeout));
    let results = futures::future::join_all(read).await;
    let body = html! {
        h1 { "Loads" }
        @if c.config.loads.is_empty() {
            p #no-loads {
                "No loader destinations are configured. " code { "fjord load" } " keeps its committed offsets beside its data, "
                "not in the brokers: give the gateway the destinations with " code { "console.loads=file:///dir,hdfs://host:port/dir" } "."
            }
        }
        @for (url, result) in c.config.loads.iter().zip(&results) {
            section.destination {
                h2 { code { (url) } }
                @match result {
                    Err(e) => (error_box(&e.to_string())),
                    Ok(jobs) if jobs.is_empty() => p { "No jobs have committed here yet." },
                    Ok(jobs) => { @for job in jobs { (job_section(&c, &caller, job)) } },
                }
            }
        }
    };
    Ok(layout::page("Loads", Nav::Loads, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_wrote_the_files_between_its_offsets_and_the_previous() {
        let state = |offsets: &[(i32, i64)]| JobState {
            offsets: BTreeMap::from([("t".to_string(), offsets.iter().copied().collect())]),
            ..JobState::default()
        };
        let previous = state(&[(0, 10), (1, 5)]);
        let now = state(&[(0, 20), (1, 5), (2, 3)]);
        assert!(written_by(&now, &previous, "t", 0, 10, 19));
        assert!(!written_by(&now, &previous, "t", 0, 0, 9), "an earlier commit's file");
        assert!(!written_by(&now, &previous, "t", 0, 20, 25), "beyond the commit: a later run's");
        assert!(!written_by(&now, &previous, "t", 1, 0, 4));
        assert!(written_by(&now, &previous, "t", 2, 0, 2), "a partition new in this commit");
        assert!(written_by(&now, &JobState::default(), "t", 0, 0, 19), "the first commit");
        assert_eq!(run_started_ms("1796010000123-4242"), Some(1_796_010_000_123));
        assert_eq!(run_started_ms("odd"), None);
    }
}
