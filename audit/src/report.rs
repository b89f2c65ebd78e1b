//! The report: reads `_audit`, counts each record id once, and compares every tier with
//! the producing tiers per topic and window.
//!
//! Every tier, the brokers included, comes from `_audit`: the brokers count the records
//! they append as partition leaders (`audit.enable`), so data retention deletes later is
//! still counted where it arrived, and a report reads only `_audit` (and `_mirror_gaps`),
//! never the audited topics.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use fjord_client::{
    Admin, ClientConfig, Consumer, ConsumerConfig, ConsumerRecord, Error as ClientError, OffsetReset, OffsetSpec, SeekTo,
    TopicPartition,
};
use fjord_record::now_ms;
use regex::Regex;
use serde::Serialize;

use crate::counter::window_ms;
use crate::record::{
    audited_topic, AuditRecord, GapRecord, AUDIT_TOPIC, DEAD_LETTER_TIER, DEFAULT_WINDOW_MS, GAPS_TOPIC, READ_COMMITTED_SUFFIX,
};
use crate::time::format_utc;
use crate::{Error, Result};

/// Tiers whose counts are what was produced: the reference is their sum.
pub const PRODUCING_TIERS: [&str; 2] = ["producer", "gateway"];

/// Display order of the known tiers (pipeline order); others follow by name.
const TIER_ORDER: [&str; 7] = ["producer", "gateway", DEAD_LETTER_TIER, "broker", "mirror", "loader", "consumer"];

/// What to report and how strictly.
#[derive(Debug, Clone)]
pub struct ReportConfig {
    /// The cluster holding `_audit`.
    pub client: ClientConfig,
    /// Only topics matching this (anchored by the caller if wanted); `None` = all.
    pub topics: Option<Regex>,
    /// Only windows starting at or after this (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Window length; audit records of another length are skipped and counted.
    pub window: Duration,
    /// How long after a window's end a mismatch is still `pending` rather than an error
    /// (late events, the publishers' interval).
    pub grace: Duration,
    /// Allowed |difference| as a fraction of the producing count (0 = exact).
    pub tolerance: f64,
    /// Bound on reading `_audit` (or `_mirror_gaps`) to its high watermark.
    pub read_timeout: Duration,
}

impl ReportConfig {
    /// Defaults: all topics, 10-minute windows, 15 minutes of grace, exact.
    pub fn new(client: ClientConfig) -> Self {
        Self {
            client,
            topics: None,
            since_ms: None,
            window: Duration::from_millis(DEFAULT_WINDOW_MS as u64),
            grace: Duration::from_secs(15 * 60),
            tolerance: 0.0,
            read_timeout: Duration::from_secs(60),
        }
    }

    /// Keeps only topics matching `pattern` (a regular expression, unanchored).
    pub fn with_topics(mut self, pattern: &str) -> Result<Self> {
        self.topics = Some(Regex::new(pattern).map_err(|e| Error::InvalidRegex(e.to_string()))?);
        Ok(self)
    }

    fn validate(&self) -> Result<i64> {
        if !(0.0..=1.0).contains(&self.tolerance) {
            return Err(Error::InvalidConfig(format!("tolerance {} must be within 0..=1", self.tolerance)));
        }
        window_ms(self.window)
    }
}

/// A window's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every tier agrees with the producing tiers (within the tolerance).
    Complete,
    /// Not yet agreeing, but still within the grace period.
    Pending,
    /// Past the grace period, some tier has fewer events than were produced.
    Loss,
    /// Past the grace period, some tier has more events than were produced, none fewer.
    Duplicates,
}

impl Verdict {
    /// The lowercase name used in every format.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Complete => "complete",
            Verdict::Pending => "pending",
            Verdict::Loss => "loss",
            Verdict::Duplicates => "duplicates",
        }
    }
}

/// One topic's window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowRow {
    /// The topic.
    pub topic: String,
    /// Window start, ms since the epoch.
    pub window_start: i64,
    /// The same, as `YYYY-MM-DDTHH:MM:SSZ`.
    pub window_start_utc: String,
    /// Tier → events counted (0 for a tier of this topic that reported nothing here).
    pub counts: BTreeMap<String, u64>,
    /// The producing count (sum of the producing tiers).
    pub produced: u64,
    /// Events of this topic the producing tiers set aside in a dead-letter topic
    /// ([`DEAD_LETTER_TIER`]): they came in with the produced ones, and are compared
    /// with nothing here (the dead-letter topic's own rows count them again).
    pub dead_lettered: u64,
    /// Tier → count minus `produced`, for the tiers downstream of the producers.
    pub differences: BTreeMap<String, i64>,
    /// The verdict.
    pub verdict: Verdict,
    /// Tiers outside the tolerance.
    pub problems: Vec<String>,
}

/// One topic's tiers, in pipeline order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopicTiers {
    /// The topic.
    pub topic: String,
    /// Its tiers.
    pub tiers: Vec<String>,
    /// The tiers whose sum is the reference.
    pub producing: Vec<String>,
}

/// The whole report (the JSON format is exactly this).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// When it was computed, ms since the epoch.
    pub generated_ms: i64,
    /// Window length, ms.
    pub window_ms: i64,
    /// Grace period, ms.
    pub grace_ms: i64,
    /// Allowed |difference| as a fraction of the producing count.
    pub tolerance: f64,
    /// Distinct audit records counted.
    pub audit_records: u64,
    /// Records seen again under an id already counted (repeated publishes), ignored.
    pub replays_ignored: u64,
    /// `_audit` records that are not well-formed audit records, skipped.
    pub malformed_skipped: u64,
    /// Well-formed records of another window length, skipped.
    pub other_window_skipped: u64,
    /// Tiers per topic.
    pub topics: Vec<TopicTiers>,
    /// Windows, by topic then start.
    pub windows: Vec<WindowRow>,
    /// Known losses recorded in `_mirror_gaps` (source data deleted before the mirror
    /// copied it), for the topics reported, in the order recorded.
    pub gaps: Vec<GapRecord>,
}

impl Report {
    /// Whether every window is complete.
    pub fn all_complete(&self) -> bool {
        self.windows.iter().all(|w| w.verdict == Verdict::Complete)
    }
}

/// Sorts tiers in pipeline order.
pub(crate) fn tier_rank(t: &str) -> (usize, &str) {
    // A read_committed consumer tier follows its plain one.
    let base = t.strip_suffix(READ_COMMITTED_SUFFIX).unwrap_or(t);
    (TIER_ORDER.iter().position(|k| *k == base).unwrap_or(TIER_ORDER.len()), t)
}

/// What was read from `_audit`, before comparing.
#[derive(Debug, Default)]
pub struct Collected {
    /// (topic, window start) → tier → count, each record id counted once.
    pub counts: BTreeMap<(String, i64), BTreeMap<String, u64>>,
    audit_records: u64,
    replays_ignored: u64,
    malformed_skipped: u64,
    other_window_skipped: u64,
    gaps: Vec<GapRecord>,
}

impl Collected {
    /// Adds one `_audit` record value (`None` = a null value).
    pub fn add_audit_value(&mut self, value: Option<&[u8]>, window_ms: i64, seen: &mut HashSet<String>) {
        let Some(r) = value.and_then(AuditRecord::decode) else {
            self.malformed_skipped += 1;
            return;
        };
        if r.window_ms != window_ms {
            self.other_window_skipped += 1;
            return;
        }
        if !seen.insert(r.id.clone()) {
            self.replays_ignored += 1;
            return;
        }
        self.audit_records += 1;
        let tier = r.report_tier();
        *self.counts.entry((r.topic, r.window_start_ms)).or_default().entry(tier).or_default() += r.count;
    }
}

/// Reads `_audit` (and `_mirror_gaps`) and computes the report.
pub async fn collect(config: &ReportConfig) -> Result<Report> {
    let window_ms = config.validate()?;
    let mut collected = Collected::default();
    let mut seen = HashSet::new();
    // With --since, reading starts at the first record timestamped an hour (or a window)
    // before it: audit records are published after their window starts and events are
    // timestamped at creation, so only clock skew beyond that slack could hide a record.
    let from = config.since_ms.map(|s| s.saturating_sub(window_ms.max(3_600_000)));
    match read_topic(&config.client, AUDIT_TOPIC, from, config.read_timeout, |r| {
        collected.add_audit_value(r.value.as_deref(), window_ms, &mut seen)
    })
    .await
    {
        Err(Error::Client(ClientError::UnknownTopic(_))) => tracing::info!("no {AUDIT_TOPIC} topic yet"),
        other => other?,
    }
    // Gaps are few and rare: read them all (the report filters by topic, not time).
    match read_topic(&config.client, GAPS_TOPIC, None, config.read_timeout, |r| {
        if let Some(gap) = r.value.as_deref().and_then(|v| serde_json::from_slice::<GapRecord>(v).ok()) {
            collected.gaps.push(gap);
        }
    })
    .await
    {
        Err(Error::Client(ClientError::UnknownTopic(_))) => {}
        other => other?,
    }
    Ok(compare(config, collected, now_ms()))
}

fn wanted(config: &ReportConfig, topic: &str) -> bool {
    audited_topic(topic) && config.topics.as_ref().is_none_or(|re| re.is_match(topic))
}

/// Compares the tiers of every window with its producing tiers.
pub fn compare(config: &ReportConfig, collected: Collected, now: i64) -> Report {
    let window_ms = i64::try_from(config.window.as_millis()).unwrap_or(i64::MAX);
    let grace_ms = i64::try_from(config.grace.as_millis()).unwrap_or(i64::MAX);
    let mut tiers: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for ((topic, _), counts) in &collected.counts {
        if wanted(config, topic) {
            tiers.entry(topic.clone()).or_default().extend(counts.keys().cloned());
        }
    }
    let topics: Vec<TopicTiers> = tiers
        .into_iter()
        .map(|(topic, set)| {
            let mut tiers: Vec<String> = set.into_iter().collect();
            tiers.sort_by(|a, b| tier_rank(a).cmp(&tier_rank(b)));
            let mut producing: Vec<String> = tiers.iter().filter(|t| PRODUCING_TIERS.contains(&t.as_str())).cloned().collect();
            // With no producing tier audited, the first tier in pipeline order is the reference.
            if producing.is_empty() {
                producing.extend(tiers.iter().find(|t| *t != DEAD_LETTER_TIER).cloned());
            }
            TopicTiers { topic, tiers, producing }
        })
        .collect();
    let by_topic: HashMap<&str, &TopicTiers> = topics.iter().map(|t| (t.topic.as_str(), t)).collect();
    let mut windows = Vec::new();
    for ((topic, start), counted) in &collected.counts {
        let Some(tt) = by_topic.get(topic.as_str()) else { continue };
        if config.since_ms.is_some_and(|s| *start < s) {
            continue;
        }
        let counts: BTreeMap<String, u64> = tt.tiers.iter().map(|t| (t.clone(), counted.get(t).copied().unwrap_or(0))).collect();
        let produced: u64 = tt.producing.iter().map(|t| counts[t]).sum();
        let dead_lettered = counts.get(DEAD_LETTER_TIER).copied().unwrap_or(0);
        let allowed = (produced as f64 * config.tolerance).floor() as i64;
        let mut differences = BTreeMap::new();
        let mut problems = Vec::new();
        let (mut short, mut over) = (false, false);
        for t in tt.tiers.iter().filter(|t| !tt.producing.contains(t) && *t != DEAD_LETTER_TIER) {
            let d = counts[t] as i64 - produced as i64;
            differences.insert(t.clone(), d);
            if d.abs() > allowed {
                problems.push(t.clone());
                short |= d < 0;
                over |= d > 0;
            }
        }
        let verdict = if problems.is_empty() {
            Verdict::Complete
        } else if now < start.saturating_add(window_ms).saturating_add(grace_ms) {
            Verdict::Pending
        } else if short {
            Verdict::Loss
        } else {
            debug_assert!(over);
            Verdict::Duplicates
        };
        windows.push(WindowRow {
            topic: topic.clone(),
            window_start: *start,
            window_start_utc: format_utc(*start),
            counts,
            produced,
            dead_lettered,
            differences,
            verdict,
            problems,
        });
    }
    Report {
        generated_ms: now,
        window_ms,
        grace_ms,
        tolerance: config.tolerance,
        audit_records: collected.audit_records,
        replays_ignored: collected.replays_ignored,
        malformed_skipped: collected.malformed_skipped,
        other_window_skipped: collected.other_window_skipped,
        topics,
        windows,
        gaps: collected.gaps.into_iter().filter(|g| wanted(config, &g.topic)).collect(),
    }
}

/// Reads every partition of `topic` from its log start (or the first record timestamped
/// at or after `from`) to the high watermark as of the start of the read, calling `f` for
/// each record.
async fn read_topic(
    client: &ClientConfig,
    topic: &str,
    from: Option<i64>,
    timeout: Duration,
    mut f: impl FnMut(&ConsumerRecord),
) -> Result<()> {
    let admin = Admin::connect(ClientConfig { allow_auto_create_topics: false, ..client.clone() }).await?;
    let meta = admin.describe_topic(topic).await?;
    let specs: Vec<(String, i32, OffsetSpec)> =
        meta.partitions.iter().map(|p| (topic.to_owned(), p.partition, OffsetSpec::Latest)).collect();
    let ends = admin.list_offsets(&specs).await?;
    let mut remaining: HashMap<i32, i64> =
        specs.iter().zip(ends).filter(|(_, end)| *end > 0).map(|((_, p, _), end)| (*p, end)).collect();
    if remaining.is_empty() {
        return Ok(());
    }
    let mut consumer = Consumer::connect(ConsumerConfig {
        client: client.clone(),
        auto_offset_reset: OffsetReset::Earliest,
        fetch_max_wait: Duration::from_millis(100),
        ..ConsumerConfig::default()
    })
    .await?;
    let tps: Vec<TopicPartition> = remaining.keys().map(|p| TopicPartition::new(topic, *p)).collect();
    consumer.assign(tps.clone()).await?;
    for tp in &tps {
        consumer.seek(tp, from.map_or(SeekTo::Beginning, SeekTo::Timestamp))?;
    }
    let deadline = tokio::time::Instant::now() + timeout;
    while !remaining.is_empty() {
        if tokio::time::Instant::now() > deadline {
            return Err(Error::ReadTimeout { topic: topic.to_owned(), timeout });
        }
        for r in consumer.poll(Duration::from_millis(200)).await? {
            if remaining.get(&r.partition).is_some_and(|end| r.offset < *end) {
                f(&r);
            }
        }
        for tp in &tps {
            if let Some(end) = remaining.get(&tp.partition).copied() {
                if consumer.position(tp).await? >= end {
                    remaining.remove(&tp.partition);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, tier: &str, topic: &str, start: i64, count: u64) -> Vec<u8> {
        AuditRecord {
            id: id.into(),
            tier: tier.into(),
            host: "h".into(),
            cluster: "c".into(),
            topic: topic.into(),
            window_start_ms: start,
            window_ms: 1000,
            count,
            published_ms: 0,
            isolation: None,
        }
        .encode()
    }

    fn config() -> ReportConfig {
        ReportConfig {
            window: Duration::from_secs(1),
            grace: Duration::from_secs(10),
            ..ReportConfig::new(ClientConfig::default())
        }
    }

    #[test]
    fn verdicts_by_difference_grace_and_tolerance() {
        let mut c = Collected::default();
        let mut seen = HashSet::new();
        for v in [
            rec("1", "gateway", "t", 0, 10),
            rec("2", "consumer", "t", 0, 10),
            rec("3", "gateway", "t", 1000, 10),
            rec("4", "consumer", "t", 1000, 7),
            rec("5", "gateway", "t", 2000, 10),
            rec("6", "consumer", "t", 2000, 12),
            // Only the gateway reported window 3000: the consumer's count is missing (0).
            rec("7", "gateway", "t", 3000, 5),
            rec("7", "gateway", "t", 3000, 5),
        ] {
            c.add_audit_value(Some(&v), 1000, &mut seen);
        }
        c.add_audit_value(Some(b"{}"), 1000, &mut seen);
        c.add_audit_value(None, 1000, &mut seen);
        let mut other = rec("8", "gateway", "t", 0, 1);
        other = String::from_utf8(other).unwrap().replace("\"window_ms\":1000", "\"window_ms\":2000").into_bytes();
        c.add_audit_value(Some(&other), 1000, &mut seen);
        let r = compare(&config(), c, 100_000);
        assert_eq!((r.audit_records, r.replays_ignored, r.malformed_skipped, r.other_window_skipped), (7, 1, 2, 1));
        let got: Vec<_> =
            r.windows.iter().map(|w| (w.window_start, w.verdict, w.differences["consumer"], w.problems.clone())).collect();
        assert_eq!(
            got,
            [
                (0, Verdict::Complete, 0, vec![]),
                (1000, Verdict::Loss, -3, vec!["consumer".to_string()]),
                (2000, Verdict::Duplicates, 2, vec!["consumer".to_string()]),
                (3000, Verdict::Loss, -5, vec!["consumer".to_string()]),
            ]
        );
        assert_eq!(r.topics[0].tiers, ["gateway", "consumer"]);
    }

    #[test]
    fn dead_letters_are_their_own_tier_and_compared_with_nothing() {
        let mut c = Collected::default();
        let mut seen = HashSet::new();
        // 500 came in for "clicks": 497 produced there, 3 set aside in "clicks.dlq".
        for v in [
            rec("1", "gateway", "clicks", 0, 497),
            rec("2", DEAD_LETTER_TIER, "clicks", 0, 3),
            rec("3", "broker", "clicks", 0, 497),
            rec("4", "gateway", "clicks.dlq", 0, 3),
            rec("5", "broker", "clicks.dlq", 0, 3),
            // Only dead letters in a window: no producing tier to compare with, still complete.
            rec("6", DEAD_LETTER_TIER, "rare", 0, 2),
        ] {
            c.add_audit_value(Some(&v), 1000, &mut seen);
        }
        let r = compare(&config(), c, 100_000);
        assert!(r.all_complete(), "{:?}", r.windows);
        let clicks = &r.windows[0];
        assert_eq!((clicks.topic.as_str(), clicks.produced, clicks.dead_lettered), ("clicks", 497, 3));
        assert_eq!(clicks.differences.keys().collect::<Vec<_>>(), ["broker"]);
        assert_eq!(r.topics[0].tiers, ["gateway", DEAD_LETTER_TIER, "broker"]);
        assert_eq!(r.topics[0].producing, ["gateway"]);
        let rare = r.topics.iter().find(|t| t.topic == "rare").unwrap();
        assert!(rare.producing.is_empty(), "{rare:?}");
    }

    /// 30 records committed and 20 aborted: the transactional producer counted the 30,
    /// a read_uncommitted consumer saw all 50, a read_committed one the 30.
    #[test]
    fn a_read_committed_consumer_is_its_own_tier_and_compares_with_committed_counts() {
        let mut c = Collected::default();
        let mut seen = HashSet::new();
        let committed = |id: &str, count: u64| {
            let plain = String::from_utf8(rec(id, "consumer", "t", 0, count)).unwrap();
            plain.replacen('{', "{\"isolation\":\"read_committed\",", 1).into_bytes()
        };
        for v in [rec("1", "producer", "t", 0, 30), rec("2", "consumer", "t", 0, 50), committed("3", 25), committed("4", 5)] {
            c.add_audit_value(Some(&v), 1000, &mut seen);
        }
        let r = compare(&config(), c, 100_000);
        assert_eq!(r.topics[0].tiers, ["producer", "consumer", "consumer (read_committed)"]);
        let w = &r.windows[0];
        assert_eq!(w.counts["consumer (read_committed)"], 30);
        assert_eq!(w.differences["consumer (read_committed)"], 0);
        assert_eq!(w.differences["consumer"], 20);
        assert_eq!((w.verdict, w.problems.clone()), (Verdict::Duplicates, vec!["consumer".to_string()]));
    }

    #[test]
    fn grace_tolerance_and_topic_filter() {
        let mut c = Collected::default();
        let mut seen = HashSet::new();
        for v in [rec("1", "producer", "a", 0, 100), rec("2", "loader", "a", 0, 95), rec("3", "producer", "b", 0, 1)] {
            c.add_audit_value(Some(&v), 1000, &mut seen);
        }
        let cfg = ReportConfig { topics: Some(Regex::new("^a$").unwrap()), ..config() };
        let r = compare(&cfg, std::mem::take(&mut c), 5_000);
        assert_eq!(r.windows.len(), 1);
        assert_eq!(r.windows[0].verdict, Verdict::Pending);
        for v in [rec("1", "producer", "a", 0, 100), rec("2", "loader", "a", 0, 95)] {
            c.add_audit_value(Some(&v), 1000, &mut HashSet::new());
        }
        let r = compare(&ReportConfig { tolerance: 0.05, ..config() }, c, 100_000);
        assert_eq!(r.windows[0].verdict, Verdict::Complete);
        assert!(ReportConfig { tolerance: 2.0, ..config() }.validate().is_err());
    }
}
