//! What the console remembers between requests: produce and consume rates per topic and
//! each group's lag per topic over the last minutes, for the overview's rates chart and a
//! group's lag chart.
//!
//! A sampler task reads every partition's log end offset (one ListOffsets per broker) and
//! every group's committed offsets every [`SAMPLE_INTERVAL`]; a rate is the growth between
//! two samples. Only partitions present in both count, so a deleted or new topic is not a
//! burst. The sampler runs only while the console is used: a page view starts it, and it
//! stops after [`IDLE_STOP`] without one, so an unused gateway sends the brokers nothing.
//!
//! Samples are kept per topic so a page sums only the topics its caller may describe.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fjord_client::TopicPartition;

use crate::Console;

/// Time between two samples.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// Samples kept: 10 minutes.
const KEPT: usize = 120;
/// The sampler stops this long after the last page view.
const IDLE_STOP: Duration = Duration::from_secs(600);
/// Groups whose lag is remembered; past it the ones not seen longest are dropped.
const MAX_GROUPS: usize = 2000;

/// Produce and consume rates (records/s) of one topic between two samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Rate {
    pub(crate) produce: f64,
    pub(crate) consume: f64,
}

/// One sample of the rates: when, and per topic.
#[derive(Debug, Clone, Default)]
pub(crate) struct RateSample {
    pub(crate) at_ms: i64,
    pub(crate) topics: BTreeMap<String, Rate>,
}

/// One sample of a group's lag, per topic.
#[derive(Debug, Clone, Default)]
pub(crate) struct LagSample {
    pub(crate) at_ms: i64,
    pub(crate) topics: BTreeMap<String, i64>,
}

/// Offsets read by one round of the sampler.
#[derive(Debug, Clone, Default)]
pub(crate) struct Offsets {
    pub(crate) at_ms: i64,
    /// Log end of every partition with a leader.
    pub(crate) ends: HashMap<TopicPartition, i64>,
    /// (group, partition) → committed offset.
    pub(crate) committed: HashMap<(String, TopicPartition), i64>,
}

#[derive(Default)]
struct Inner {
    previous: Option<Offsets>,
    rates: VecDeque<RateSample>,
    lags: HashMap<String, VecDeque<LagSample>>,
}

/// The console's memory of rates and lag.
#[derive(Default)]
pub(crate) struct History {
    inner: Mutex<Inner>,
    /// When a page was last viewed (ms since the epoch).
    last_used_ms: AtomicI64,
    sampler_running: AtomicBool,
}

/// Records/s per topic between `before` and `after`: the growth of every partition (log
/// end for produce, each group's committed offset for consume) present in both. A
/// shrinking offset (a topic recreated, offsets reset) counts 0, not a negative rate.
pub(crate) fn rates(before: &Offsets, after: &Offsets) -> BTreeMap<String, Rate> {
    let secs = (after.at_ms - before.at_ms) as f64 / 1000.0;
    let mut out: BTreeMap<String, Rate> = BTreeMap::new();
    if secs <= 0.0 {
        return out;
    }
    for (tp, end) in &after.ends {
        let grown = before.ends.get(tp).map_or(0, |b| (end - b).max(0));
        out.entry(tp.topic.clone()).or_default().produce += grown as f64 / secs;
    }
    for ((group, tp), committed) in &after.committed {
        let grown = before.committed.get(&(group.clone(), tp.clone())).map_or(0, |b| (committed - b).max(0));
        out.entry(tp.topic.clone()).or_default().consume += grown as f64 / secs;
    }
    out
}

fn push<T>(ring: &mut VecDeque<T>, item: T) {
    if ring.len() == KEPT {
        ring.pop_front();
    }
    ring.push_back(item);
}

impl History {
    /// Adds a sampler round: the rates since the previous round, and every group's lag.
    pub(crate) fn record(&self, offsets: Offsets, lags: Vec<(String, LagSample)>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(before) = &inner.previous {
            let topics = rates(before, &offsets);
            push(&mut inner.rates, RateSample { at_ms: offsets.at_ms, topics });
        }
        inner.previous = Some(offsets);
        for (group, sample) in lags {
            Self::add_lag(&mut inner, group, sample);
        }
    }

    /// Adds one group's lag, read by a page or the live lag stream between sampler rounds.
    pub(crate) fn record_lag(&self, group: &str, sample: LagSample) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Self::add_lag(&mut inner, group.to_string(), sample);
    }

    fn add_lag(inner: &mut Inner, group: String, sample: LagSample) {
        if !inner.lags.contains_key(&group) && inner.lags.len() >= MAX_GROUPS {
            let oldest = inner.lags.iter().min_by_key(|(_, r)| r.back().map_or(0, |s| s.at_ms)).map(|(g, _)| g.clone());
            if let Some(g) = oldest {
                inner.lags.remove(&g);
            }
        }
        let ring = inner.lags.entry(group).or_default();
        // Two reads within a second (a page and the stream) are one point.
        if ring.back().is_some_and(|last| sample.at_ms - last.at_ms < 1000) {
            ring.pop_back();
        }
        push(ring, sample);
    }

    pub(crate) fn rates(&self) -> Vec<RateSample> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).rates.iter().cloned().collect()
    }

    pub(crate) fn lag(&self, group: &str) -> Vec<LagSample> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.lags.get(group).map(|r| r.iter().cloned().collect()).unwrap_or_default()
    }
}

/// Notes a page view and starts the sampler if it is not running.
pub(crate) fn touch(console: &Arc<Console>) {
    let history = &console.history;
    history.last_used_ms.store(fjord_record::now_ms(), Ordering::Relaxed);
    if history.sampler_running.swap(true, Ordering::AcqRel) {
        return;
    }
    let console = console.clone();
    tokio::spawn(async move {
        loop {
            match sample(&console).await {
                Ok((offsets, lags)) => console.history.record(offsets, lags),
                Err(e) => tracing::debug!(error = %e, "console: rate sample failed"),
            }
            tokio::time::sleep(SAMPLE_INTERVAL).await;
            let idle = fjord_record::now_ms() - console.history.last_used_ms.load(Ordering::Relaxed);
            if idle > IDLE_STOP.as_millis() as i64 {
                console.history.sampler_running.store(false, Ordering::Release);
                return;
            }
        }
    });
}

/// One sampler round: log ends of every partition, every group's committed offsets and lag.
async fn sample(c: &Console) -> crate::Result<(Offsets, Vec<(String, LagSample)>)> {
    let metadata = c.brokers.metadata().await?;
    let topics: Vec<_> = metadata.topics.values().cloned().collect();
    let rows = c.brokers.with_offsets_latest(&topics).await?;
    let at_ms = fjord_record::now_ms();
    let mut offsets = Offsets { at_ms, ..Offsets::default() };
    for (tp, end) in rows {
        offsets.ends.insert(tp, end);
    }
    let groups: Vec<String> = c.brokers.list_groups().await?.into_iter().map(|(g, _)| g).collect();
    let mut lags = Vec::with_capacity(groups.len());
    for (group, lag) in c.brokers.groups_lag(&groups, false).await? {
        let Ok(lag) = lag else { continue };
        let mut topics: BTreeMap<String, i64> = BTreeMap::new();
        for (tp, committed, end) in lag.partitions {
            *topics.entry(tp.topic.clone()).or_default() += crate::brokers::lag(committed, end);
            offsets.committed.insert((group.clone(), tp), committed);
        }
        lags.push((group, LagSample { at_ms, topics }));
    }
    Ok((offsets, lags))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(t: &str, p: i32) -> TopicPartition {
        TopicPartition::new(t, p)
    }

    #[test]
    fn rates_count_growth_of_partitions_in_both_samples() {
        let before = Offsets {
            at_ms: 10_000,
            ends: HashMap::from([(tp("a", 0), 100), (tp("a", 1), 50), (tp("gone", 0), 1000)]),
            committed: HashMap::from([(("g".into(), tp("a", 0)), 90)]),
        };
        let after = Offsets {
            at_ms: 15_000,
            // a/0 grew 50, a/1 was recreated (shrank: 0), new/0 is new (not a burst).
            ends: HashMap::from([(tp("a", 0), 150), (tp("a", 1), 10), (tp("new", 0), 5000)]),
            committed: HashMap::from([(("g".into(), tp("a", 0)), 140), (("h".into(), tp("a", 0)), 150)]),
        };
        let r = rates(&before, &after);
        assert_eq!(r["a"], Rate { produce: 10.0, consume: 10.0 });
        assert_eq!(r["new"], Rate { produce: 0.0, consume: 0.0 });
        assert!(!r.contains_key("gone"));
        assert!(rates(&after, &after).values().all(|r| *r == Rate::default()));
    }

    #[test]
    fn rings_keep_the_newest_samples() {
        let h = History::default();
        for i in 0..(KEPT as i64 + 5) {
            let offsets = Offsets { at_ms: i * 5000, ends: HashMap::from([(tp("a", 0), i * 10)]), ..Offsets::default() };
            h.record(offsets, vec![("g".into(), LagSample { at_ms: i * 5000, topics: BTreeMap::from([("a".into(), i)]) })]);
        }
        let rates = h.rates();
        assert_eq!(rates.len(), KEPT);
        assert_eq!(rates.last().unwrap().topics["a"].produce, 2.0);
        let lag = h.lag("g");
        assert_eq!(lag.len(), KEPT);
        assert_eq!(lag.last().unwrap().topics["a"], KEPT as i64 + 4);
        // A page's read right after a sample replaces it rather than adding a point.
        h.record_lag("g", LagSample { at_ms: (KEPT as i64 + 4) * 5000 + 10, topics: BTreeMap::new() });
        assert_eq!(h.lag("g").len(), KEPT);
        assert!(h.lag("other").is_empty());
    }
}
