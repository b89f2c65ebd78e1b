//! What the mirror knows about itself, shared by the source tasks and the HTTP endpoint:
//! per source its state and counts, per owned partition the mirrored position and the
//! source's log end (so the lag), and every gap found. Rendered as Prometheus text
//! (`/metrics`) and as the JSON [`Status`] (`/status`, `fjord mirror status`).

use std::collections::BTreeMap;
use std::sync::Mutex;

use fjord_client::TopicPartition;
use fjord_metrics::{escape, samples, Kind};
use serde::{Deserialize, Serialize};

use crate::config::SourceConfig;

/// How a source is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceState {
    /// Not reached yet.
    Connecting,
    /// Connected and mirroring.
    Up,
    /// Unreachable or failing; retried with backoff (`last_error` says why).
    Retrying,
}

/// A range of source offsets that retention deleted before the mirror copied it: lost.
/// The audit's record type, so what `/status` shows is what `_mirror_gaps` holds.
pub use fjord_audit::GapRecord as Gap;

/// One owned source partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionStatus {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// Where its records go.
    pub target_topic: String,
    /// Next source offset to copy: everything before it is acknowledged by the target
    /// (-1 before the first position is known).
    pub mirrored: i64,
    /// The source's log end offset at the last lag refresh (-1 before the first).
    pub log_end: i64,
    /// `log_end - mirrored` when both are known.
    pub lag: Option<i64>,
    /// Why the partition waits at `mirrored`: the target refuses that record (too large,
    /// invalid, stamped outside its limits). It is sent again now and then while the
    /// source's other partitions go on; `--dead-letter-topic` would set it aside.
    #[serde(default)]
    pub refused: Option<String>,
}

/// One source cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStatus {
    /// Alias.
    pub alias: String,
    /// Bootstrap list.
    pub bootstrap: String,
    /// State.
    pub state: SourceState,
    /// The last failure, while retrying.
    pub last_error: Option<String>,
    /// Failed attempts to reach or read the source since the mirror started.
    pub failures: u64,
    /// Records the target acknowledged.
    pub records: u64,
    /// Records the target refused that went to the dead-letter topic instead.
    #[serde(default)]
    pub dead_letters: u64,
    /// Offset commits in the source group.
    pub commits: u64,
    /// Owned partitions.
    pub partitions: Vec<PartitionStatus>,
}

/// The whole mirror process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Sources in configuration order.
    pub sources: Vec<SourceStatus>,
    /// Gaps found since the mirror started, in order found.
    pub gaps: Vec<Gap>,
}

struct PartitionEntry {
    target_topic: String,
    mirrored: i64,
    log_end: i64,
    refused: Option<String>,
}

struct SourceEntry {
    bootstrap: String,
    state: SourceState,
    last_error: Option<String>,
    failures: u64,
    records: BTreeMap<String, u64>,
    /// Per source topic.
    dead_letters: BTreeMap<String, u64>,
    commits: u64,
    partitions: BTreeMap<TopicPartition, PartitionEntry>,
}

/// The shared state; one mutex, touched a few times per poll, never per record.
pub(crate) struct Stats {
    /// Sources in configuration order.
    order: Vec<String>,
    inner: Mutex<Inner>,
}

struct Inner {
    sources: BTreeMap<String, SourceEntry>,
    gaps: Vec<Gap>,
}

impl Stats {
    pub(crate) fn new(sources: &[SourceConfig]) -> Self {
        let entries = sources
            .iter()
            .map(|s| {
                let entry = SourceEntry {
                    bootstrap: s.bootstrap.clone(),
                    state: SourceState::Connecting,
                    last_error: None,
                    failures: 0,
                    records: BTreeMap::new(),
                    dead_letters: BTreeMap::new(),
                    commits: 0,
                    partitions: BTreeMap::new(),
                };
                (s.alias.clone(), entry)
            })
            .collect();
        Self {
            order: sources.iter().map(|s| s.alias.clone()).collect(),
            inner: Mutex::new(Inner { sources: entries, gaps: Vec::new() }),
        }
    }

    fn with<R>(&self, alias: &str, f: impl FnOnce(&mut SourceEntry) -> R) -> Option<R> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.sources.get_mut(alias).map(f)
    }

    pub(crate) fn up(&self, alias: &str) {
        self.with(alias, |s| {
            s.state = SourceState::Up;
            s.last_error = None;
        });
    }

    pub(crate) fn failed(&self, alias: &str, error: &str) {
        self.with(alias, |s| {
            s.state = SourceState::Retrying;
            s.last_error = Some(error.to_string());
            s.failures += 1;
        });
    }

    pub(crate) fn assigned(&self, alias: &str, tp: &TopicPartition, target_topic: &str, mirrored: i64) {
        self.with(alias, |s| {
            let entry = PartitionEntry { target_topic: target_topic.to_string(), mirrored, log_end: -1, refused: None };
            s.partitions.insert(tp.clone(), entry);
        });
    }

    pub(crate) fn revoked(&self, alias: &str, tp: &TopicPartition) {
        self.with(alias, |s| s.partitions.remove(tp));
    }

    /// Everything of the source is given up (its session ended).
    pub(crate) fn revoke_all(&self, alias: &str) {
        self.with(alias, |s| s.partitions.clear());
    }

    /// `tp` waits at a record the target refuses (why), or goes on (`None`).
    pub(crate) fn held(&self, alias: &str, tp: &TopicPartition, refused: Option<String>) {
        self.with(alias, |s| {
            if let Some(p) = s.partitions.get_mut(tp) {
                p.refused = refused;
            }
        });
    }

    /// The target acknowledged everything before `next` of `tp`.
    pub(crate) fn mirrored(&self, alias: &str, tp: &TopicPartition, next: i64) {
        self.with(alias, |s| {
            if let Some(p) = s.partitions.get_mut(tp) {
                p.mirrored = p.mirrored.max(next);
            }
        });
    }

    pub(crate) fn acknowledged(&self, alias: &str, counts: &BTreeMap<String, u64>) {
        self.with(alias, |s| {
            for (topic, n) in counts {
                *s.records.entry(topic.clone()).or_default() += n;
            }
        });
    }

    pub(crate) fn dead_lettered(&self, alias: &str, counts: &BTreeMap<String, u64>) {
        self.with(alias, |s| {
            for (topic, n) in counts {
                *s.dead_letters.entry(topic.clone()).or_default() += n;
            }
        });
    }

    pub(crate) fn committed(&self, alias: &str) {
        self.with(alias, |s| s.commits += 1);
    }

    pub(crate) fn owned(&self, alias: &str) -> Vec<TopicPartition> {
        self.with(alias, |s| s.partitions.keys().cloned().collect()).unwrap_or_default()
    }

    pub(crate) fn log_ends(&self, alias: &str, ends: &[(TopicPartition, i64)]) {
        self.with(alias, |s| {
            for (tp, end) in ends {
                if let Some(p) = s.partitions.get_mut(tp) {
                    p.log_end = *end;
                }
            }
        });
    }

    pub(crate) fn gap(&self, gap: Gap) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).gaps.push(gap);
    }

    pub(crate) fn status(&self) -> Status {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let sources = self
            .order
            .iter()
            .filter_map(|alias| inner.sources.get(alias).map(|s| (alias, s)))
            .map(|(alias, s)| SourceStatus {
                alias: alias.clone(),
                bootstrap: s.bootstrap.clone(),
                state: s.state,
                last_error: s.last_error.clone(),
                failures: s.failures,
                records: s.records.values().sum(),
                dead_letters: s.dead_letters.values().sum(),
                commits: s.commits,
                partitions: s
                    .partitions
                    .iter()
                    .map(|(tp, p)| PartitionStatus {
                        topic: tp.topic.clone(),
                        partition: tp.partition,
                        target_topic: p.target_topic.clone(),
                        mirrored: p.mirrored,
                        log_end: p.log_end,
                        lag: (p.mirrored >= 0 && p.log_end >= 0).then(|| (p.log_end - p.mirrored).max(0)),
                        refused: p.refused.clone(),
                    })
                    .collect(),
            })
            .collect();
        Status { sources, gaps: inner.gaps.clone() }
    }

    /// Prometheus text exposition format 0.0.4.
    pub(crate) fn prometheus(&self) -> String {
        let status = self.status();
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        samples(
            &mut out,
            "fjord_mirror_source_up",
            Kind::Gauge,
            "1 while the source is reachable and mirrored, 0 while it is retried.",
            status.sources.iter().map(|s| (format!("source=\"{}\"", escape(&s.alias)), i64::from(s.state == SourceState::Up))),
        );
        samples(
            &mut out,
            "fjord_mirror_source_failures_total",
            Kind::Counter,
            "Failed attempts to reach or read the source.",
            status.sources.iter().map(|s| (format!("source=\"{}\"", escape(&s.alias)), s.failures as i64)),
        );
        samples(
            &mut out,
            "fjord_mirror_commits_total",
            Kind::Counter,
            "Offset commits in the source group (each after the target acknowledged).",
            status.sources.iter().map(|s| (format!("source=\"{}\"", escape(&s.alias)), s.commits as i64)),
        );
        let records = inner.sources.iter().flat_map(|(alias, s)| {
            s.records.iter().map(move |(t, n)| (format!("source=\"{}\",topic=\"{}\"", escape(alias), escape(t)), *n as i64))
        });
        samples(&mut out, "fjord_mirror_records_total", Kind::Counter, "Records copied and acknowledged by the target.", records);
        let dead = inner.sources.iter().flat_map(|(alias, s)| {
            s.dead_letters.iter().map(move |(t, n)| (format!("source=\"{}\",topic=\"{}\"", escape(alias), escape(t)), *n as i64))
        });
        samples(
            &mut out,
            "fjord_mirror_dead_letters_total",
            Kind::Counter,
            "Records the target refused, written to the dead-letter topic instead (per source topic).",
            dead,
        );
        let partitions: Vec<(String, &PartitionStatus)> = status
            .sources
            .iter()
            .flat_map(|s| {
                s.partitions.iter().map(move |p| {
                    (format!("source=\"{}\",topic=\"{}\",partition=\"{}\"", escape(&s.alias), escape(&p.topic), p.partition), p)
                })
            })
            .collect();
        samples(
            &mut out,
            "fjord_mirror_lag",
            Kind::Gauge,
            "Source log end offset minus the mirrored position, per source partition.",
            partitions.iter().filter_map(|(l, p)| p.lag.map(|lag| (l.clone(), lag))),
        );
        samples(
            &mut out,
            "fjord_mirror_position",
            Kind::Gauge,
            "Next source offset to copy (everything before it is in the target).",
            partitions.iter().filter(|(_, p)| p.mirrored >= 0).map(|(l, p)| (l.clone(), p.mirrored)),
        );
        samples(
            &mut out,
            "fjord_mirror_partition_held",
            Kind::Gauge,
            "1 while the partition waits at a record the target refuses (see /status).",
            partitions.iter().filter(|(_, p)| p.refused.is_some()).map(|(l, _)| (l.clone(), 1)),
        );
        samples(
            &mut out,
            "fjord_mirror_source_log_end_offset",
            Kind::Gauge,
            "Source log end offset at the last lag refresh.",
            partitions.iter().filter(|(_, p)| p.log_end >= 0).map(|(l, p)| (l.clone(), p.log_end)),
        );
        let mut gaps: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for g in &status.gaps {
            let e = gaps
                .entry(format!("source=\"{}\",topic=\"{}\",partition=\"{}\"", escape(&g.source), escape(&g.topic), g.partition))
                .or_default();
            e.0 += 1;
            e.1 += g.records;
        }
        samples(
            &mut out,
            "fjord_mirror_gaps_total",
            Kind::Counter,
            "Ranges of source offsets deleted by retention before they were mirrored.",
            gaps.iter().map(|(l, (n, _))| (l.clone(), *n)),
        );
        samples(
            &mut out,
            "fjord_mirror_gap_records_total",
            Kind::Counter,
            "Records lost to retention before they were mirrored.",
            gaps.iter().map(|(l, (_, n))| (l.clone(), *n)),
        );
        out
    }
}
