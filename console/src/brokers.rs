//! What the pages read from the brokers, through `fjord-client`'s admin, group admin and
//! consumer, each call bounded by the console's timeout so a page never hangs on a broker
//! that is down: it shows the error instead.
//!
//! The admin clients connect on first use and are kept; a failed connect is tried again by
//! the next page.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fjord_client::{
    Admin, ClientConfig, ConfigEntry, Consumer, ConsumerConfig, GroupAdmin, GroupDescription, LogDirDescription, Metadata,
    OffsetReset, OffsetSpec, SeekTo, TopicMetadata, TopicPartition,
};
use futures::StreamExt;
use tokio::sync::OnceCell;

use crate::{Error, Result};

/// The longest a page waits for a broker's log dir sizes: sizes are extra, so a slow broker
/// costs the page at most this before its partitions show "—".
const SIZES_TIMEOUT: Duration = Duration::from_secs(2);

/// Topic configs the topic list shows.
pub(crate) const LIST_CONFIGS: [&str; 3] = ["retention.ms", "retention.bytes", "cleanup.policy"];

/// Groups described at once on the group list: enough to hide the round trips, few enough
/// not to flood a coordinator.
const GROUP_CONCURRENCY: usize = 16;

/// The console's handle on the cluster.
pub(crate) struct Brokers {
    client: ClientConfig,
    timeout: Duration,
    admin: OnceCell<Admin>,
    groups: OnceCell<GroupAdmin>,
}

/// Runs `f` within `limit`: past it the page says so instead of waiting.
pub(crate) async fn bounded<T>(
    limit: Duration,
    what: &'static str,
    f: impl std::future::Future<Output = fjord_client::Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(Error::broker(what)),
        Err(_) => Err(Error::Timeout { what, timeout: limit }),
    }
}

/// One partition with its offsets, as the topic page and the topic list use it.
#[derive(Debug, Clone)]
pub(crate) struct PartitionRow {
    pub(crate) partition: i32,
    pub(crate) leader: i32,
    pub(crate) replicas: Vec<i32>,
    pub(crate) isr: Vec<i32>,
    pub(crate) offline_replicas: Vec<i32>,
    pub(crate) error_code: i16,
    /// Log start and end; `None` when the partition has no leader to ask.
    pub(crate) offsets: Option<(i64, i64)>,
}

impl PartitionRow {
    pub(crate) fn under_replicated(&self) -> bool {
        self.isr.len() < self.replicas.len()
    }

    pub(crate) fn offline(&self) -> bool {
        self.leader < 0 || self.error_code != 0
    }
}

/// A topic with its partitions and offsets.
#[derive(Debug, Clone)]
pub(crate) struct TopicRow {
    pub(crate) name: String,
    pub(crate) partitions: Vec<PartitionRow>,
}

impl TopicRow {
    pub(crate) fn replication(&self) -> usize {
        self.partitions.iter().map(|p| p.replicas.len()).max().unwrap_or(0)
    }

    /// Records between log start and log end over the partitions that answered.
    pub(crate) fn records(&self) -> i64 {
        self.partitions.iter().filter_map(|p| p.offsets).map(|(s, e)| (e - s).max(0)).sum()
    }
}

/// Bytes on disk of each partition's leader copy, from every live broker's DescribeLogDirs.
#[derive(Debug, Default)]
pub(crate) struct Sizes {
    /// (topic, partition) → bytes of the leader's copy, for the leaders that answered.
    pub(crate) leader_bytes: HashMap<(String, i32), i64>,
    /// Brokers that did not answer in time, with why.
    pub(crate) failed: Vec<(i32, Error)>,
}

impl Sizes {
    /// Bytes of one partition's leader copy; `None` when its leader did not answer.
    pub(crate) fn partition(&self, topic: &str, partition: i32) -> Option<i64> {
        self.leader_bytes.get(&(topic.to_string(), partition)).copied()
    }

    /// Bytes of a topic's leader copies; `None` unless every partition's leader answered
    /// (a partial sum would look like a smaller topic).
    pub(crate) fn topic(&self, topic: &TopicRow) -> Option<i64> {
        topic.partitions.iter().map(|p| self.partition(&topic.name, p.partition)).sum()
    }
}

/// The size of each partition's leader copy in `answers` (broker → its log dirs): the
/// replica on the partition's leader, not a future copy a log dir move is writing.
pub(crate) fn leader_sizes(
    leaders: &HashMap<(String, i32), i32>,
    answers: &[(i32, Vec<LogDirDescription>)],
) -> HashMap<(String, i32), i64> {
    let mut out = HashMap::new();
    for (broker, dirs) in answers {
        for r in dirs.iter().flat_map(|d| &d.replicas).filter(|r| !r.is_future) {
            let key = (r.topic.clone(), r.partition);
            if leaders.get(&key) == Some(broker) {
                out.insert(key, r.size);
            }
        }
    }
    out
}

/// A group with its committed offsets and lag.
#[derive(Debug, Clone)]
pub(crate) struct GroupLag {
    pub(crate) description: Option<GroupDescription>,
    pub(crate) state: String,
    /// (partition, committed, log end); log end -1 when unknown.
    pub(crate) partitions: Vec<(TopicPartition, i64, i64)>,
}

impl GroupLag {
    pub(crate) fn total_lag(&self) -> i64 {
        self.partitions.iter().map(|(_, c, e)| lag(*c, *e)).sum()
    }
}

/// Lag of one partition: records past the committed offset (0 when the end is unknown).
pub(crate) fn lag(committed: i64, end: i64) -> i64 {
    if end < 0 {
        0
    } else {
        (end - committed).max(0)
    }
}

/// A group's description (when asked for) and committed offsets.
type Committed = (Option<GroupDescription>, BTreeMap<TopicPartition, i64>);

/// One fetched record.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) timestamp: i64,
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    pub(crate) headers: Vec<(String, Option<Bytes>)>,
}

/// Which records of a topic to browse.
#[derive(Debug, Clone)]
pub(crate) struct Browse {
    /// One partition, or all of them (up to [`MAX_BROWSE_PARTITIONS`]).
    pub(crate) partition: Option<i32>,
    /// Where to start; the newest `limit` records when `Newest`.
    pub(crate) start: Start,
    pub(crate) limit: usize,
}

/// Where a browse starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Start {
    /// The newest records.
    Newest,
    /// This offset in every partition browsed.
    Offset(i64),
    /// The first record at or after this timestamp (ms), found per partition.
    Timestamp(i64),
}

/// Partitions read at once when browsing "all partitions".
pub(crate) const MAX_BROWSE_PARTITIONS: usize = 64;

impl Brokers {
    pub(crate) fn new(client: ClientConfig, timeout: Duration) -> Self {
        Self { client, timeout, admin: OnceCell::new(), groups: OnceCell::new() }
    }

    async fn admin(&self) -> Result<&Admin> {
        let connect = self.admin.get_or_try_init(|| Admin::connect(self.client.clone()));
        bounded(self.timeout, "be reached (admin client)", connect).await
    }

    async fn group_admin(&self) -> Result<&GroupAdmin> {
        let connect = self.groups.get_or_try_init(|| GroupAdmin::connect(self.client.clone()));
        bounded(self.timeout, "be reached (group admin client)", connect).await
    }

    pub(crate) async fn metadata(&self) -> Result<Arc<Metadata>> {
        let admin = self.admin().await?;
        bounded(self.timeout, "describe the cluster", admin.metadata()).await
    }

    /// Adds log start and end offsets to the partitions of `topics` (two ListOffsets
    /// rounds for all of them; partitions without a leader are not asked).
    pub(crate) async fn with_offsets(&self, topics: &[Arc<TopicMetadata>]) -> Result<Vec<TopicRow>> {
        let admin = self.admin().await?;
        let mut asked: Vec<(String, i32, OffsetSpec)> = Vec::new();
        for t in topics {
            for p in t.partitions.iter().filter(|p| p.leader >= 0 && p.error_code == 0) {
                asked.push((t.name.clone(), p.partition, OffsetSpec::Earliest));
            }
        }
        let (earliest, latest) = if asked.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let latest_specs: Vec<_> = asked.iter().map(|(t, p, _)| (t.clone(), *p, OffsetSpec::Latest)).collect();
            let (e, l) = tokio::join!(
                bounded(self.timeout, "list log start offsets", admin.list_offsets(&asked)),
                bounded(self.timeout, "list log end offsets", admin.list_offsets(&latest_specs)),
            );
            (e?, l?)
        };
        let mut found: HashMap<(&str, i32), (i64, i64)> = HashMap::with_capacity(asked.len());
        for (((t, p, _), s), e) in asked.iter().zip(earliest).zip(latest) {
            found.insert((t.as_str(), *p), (s, e));
        }
        Ok(topics
            .iter()
            .map(|t| TopicRow {
                name: t.name.clone(),
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| PartitionRow {
                        partition: p.partition,
                        leader: p.leader,
                        replicas: p.replicas.clone(),
                        isr: p.in_sync_replicas.clone(),
                        offline_replicas: p.offline_replicas.clone(),
                        error_code: p.error_code,
                        offsets: found.get(&(t.name.as_str(), p.partition)).copied(),
                    })
                    .collect(),
            })
            .collect())
    }

    /// Log end offsets of every partition of `topics` that has a leader, in one
    /// ListOffsets round (the rates sampler's).
    pub(crate) async fn with_offsets_latest(&self, topics: &[Arc<TopicMetadata>]) -> Result<Vec<(TopicPartition, i64)>> {
        let admin = self.admin().await?;
        let asked: Vec<(String, i32, OffsetSpec)> = topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .filter(|p| p.leader >= 0 && p.error_code == 0)
                    .map(|p| (t.name.clone(), p.partition, OffsetSpec::Latest))
            })
            .collect();
        if asked.is_empty() {
            return Ok(Vec::new());
        }
        let ends = bounded(self.timeout, "list log end offsets", admin.list_offsets(&asked)).await?;
        Ok(asked.into_iter().zip(ends).map(|((t, p, _), e)| (TopicPartition::new(t, p), e)).collect())
    }

    /// One topic's metadata (refreshed).
    pub(crate) async fn topic(&self, name: &str) -> Result<Arc<TopicMetadata>> {
        let admin = self.admin().await?;
        match bounded(self.timeout, "describe the topic", admin.describe_topic(name)).await {
            Err(Error::Broker { source: fjord_client::Error::UnknownTopic(_), .. }) => {
                Err(Error::NotFound { kind: "topic", name: name.to_string() })
            }
            other => other,
        }
    }

    /// Configs of `topics` (only `keys`, or all).
    pub(crate) async fn configs(
        &self,
        topics: &[String],
        keys: Option<&[&str]>,
    ) -> Result<Vec<(String, fjord_client::Result<Vec<ConfigEntry>>)>> {
        if topics.is_empty() {
            return Ok(Vec::new());
        }
        let admin = self.admin().await?;
        bounded(self.timeout, "describe topic configs", admin.describe_topics_configs(topics, keys)).await
    }

    pub(crate) async fn create_topic(&self, topic: fjord_client::NewTopic) -> Result<()> {
        let admin = self.admin().await?;
        bounded(self.timeout, "create the topic", admin.create_topics(&[topic])).await
    }

    pub(crate) async fn alter_config(&self, topic: &str, name: &str, value: &str) -> Result<()> {
        let admin = self.admin().await?;
        let configs = BTreeMap::from([(name.to_string(), value.to_string())]);
        bounded(self.timeout, "alter the topic's config", admin.alter_configs(topic, &configs)).await
    }

    pub(crate) async fn delete_topic(&self, name: &str) -> Result<()> {
        let admin = self.admin().await?;
        bounded(self.timeout, "delete the topic", admin.delete_topics(&[name.to_string()])).await
    }

    /// Reads records of `topic` per `browse`: the newest `limit`, or the first `limit`
    /// from the start asked for; shown newest first.
    pub(crate) async fn browse(&self, topic: &TopicRow, browse: &Browse) -> Result<Vec<Record>> {
        let partitions: Vec<&PartitionRow> = topic
            .partitions
            .iter()
            .filter(|p| p.offsets.is_some() && browse.partition.is_none_or(|want| want == p.partition))
            .take(MAX_BROWSE_PARTITIONS)
            .collect();
        // The offset of a timestamp in each partition (the log end when nothing is as new).
        let by_time: HashMap<i32, i64> = match browse.start {
            Start::Timestamp(ts) if !partitions.is_empty() => {
                let admin = self.admin().await?;
                let specs: Vec<_> =
                    partitions.iter().map(|p| (topic.name.clone(), p.partition, OffsetSpec::Timestamp(ts))).collect();
                let offsets = bounded(self.timeout, "find offsets by timestamp", admin.list_offsets(&specs)).await?;
                partitions.iter().map(|p| p.partition).zip(offsets).collect()
            }
            _ => HashMap::new(),
        };
        // (partition, first offset, end offset exclusive)
        let mut ranges: Vec<(i32, i64, i64)> = Vec::new();
        let limit = browse.limit as i64;
        for p in &partitions {
            let Some((start, end)) = p.offsets else { continue };
            let first = match browse.start {
                Start::Newest => (end - limit).max(start),
                Start::Offset(o) => o.clamp(start, end),
                Start::Timestamp(_) => by_time.get(&p.partition).copied().unwrap_or(end).clamp(start, end),
            };
            let to = (first + limit).min(end);
            if first < to {
                ranges.push((p.partition, first, to));
            }
        }
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let config = ConsumerConfig {
            client: ClientConfig { allow_auto_create_topics: false, client_id: "fjord-console".into(), ..self.client.clone() },
            auto_offset_reset: OffsetReset::None,
            fetch_max_wait: Duration::from_millis(100),
            ..ConsumerConfig::default()
        };
        let read = async {
            let mut consumer = Consumer::connect(config).await?;
            let assigned: Vec<TopicPartition> = ranges.iter().map(|(p, _, _)| TopicPartition::new(&topic.name, *p)).collect();
            consumer.assign(assigned).await?;
            for (p, from, _) in &ranges {
                consumer.seek(&TopicPartition::new(&topic.name, *p), SeekTo::Offset(*from))?;
            }
            let mut wanted: BTreeMap<i32, i64> = ranges.iter().map(|(p, _, to)| (*p, *to)).collect();
            let mut records = Vec::new();
            // Ends when every partition reached its end offset; a partition whose last
            // offsets are transaction markers or compacted away never delivers them, so the
            // position, not the last record, says when it is done.
            while !wanted.is_empty() {
                for r in consumer.poll(Duration::from_millis(200)).await? {
                    if wanted.get(&r.partition).is_some_and(|to| r.offset < *to) {
                        records.push(Record {
                            partition: r.partition,
                            offset: r.offset,
                            timestamp: r.timestamp,
                            key: r.key,
                            value: r.value,
                            headers: r.headers,
                        });
                    }
                }
                let mut done = Vec::new();
                for (p, to) in &wanted {
                    if consumer.position(&TopicPartition::new(&topic.name, *p)).await? >= *to {
                        done.push(*p);
                    }
                }
                for p in done {
                    wanted.remove(&p);
                }
            }
            Ok::<_, fjord_client::Error>(records)
        };
        let mut records = bounded(self.timeout, "read the records", read).await?;
        // By timestamp, then offset, so partitions interleave by time; from a start the
        // first `limit` after it are kept, else the newest. Shown newest first.
        records.sort_by_key(|r| (r.timestamp, r.offset, r.partition));
        if browse.start == Start::Newest {
            let cut = records.len().saturating_sub(browse.limit);
            records.drain(..cut);
        } else {
            records.truncate(browse.limit);
        }
        records.reverse();
        Ok(records)
    }

    /// (group id, state) of every group.
    pub(crate) async fn list_groups(&self) -> Result<Vec<(String, String)>> {
        let admin = self.group_admin().await?;
        bounded(self.timeout, "list the groups", admin.list_groups()).await
    }

    /// State, members, committed offsets and lag of `groups`, several at once; each
    /// group's failure is its own.
    pub(crate) async fn groups_lag(&self, groups: &[String], describe: bool) -> Result<Vec<(String, Result<GroupLag>)>> {
        let admin = self.group_admin().await?;
        let timeout = self.timeout;
        let committed: Vec<(String, Result<Committed>)> = futures::stream::iter(groups.iter().cloned())
            .map(|g| async move {
                let r = async {
                    let description = if describe {
                        Some(bounded(timeout, "describe the group", admin.describe_group(&g)).await?)
                    } else {
                        None
                    };
                    let offsets = bounded(timeout, "fetch committed offsets", admin.committed_offsets(&g)).await?;
                    Ok((description, offsets))
                }
                .await;
                (g, r)
            })
            .buffered(GROUP_CONCURRENCY)
            .collect()
            .await;
        // One ListOffsets round for every partition of every group.
        let mut partitions: Vec<TopicPartition> =
            committed.iter().filter_map(|(_, r)| r.as_ref().ok()).flat_map(|(_, o)| o.keys().cloned()).collect();
        partitions.sort();
        partitions.dedup();
        let ends: HashMap<TopicPartition, i64> = if partitions.is_empty() {
            HashMap::new()
        } else {
            let ends = bounded(timeout, "list log end offsets", admin.log_end_offsets(&partitions)).await?;
            partitions.into_iter().zip(ends).collect()
        };
        Ok(committed
            .into_iter()
            .map(|(g, r)| {
                let r = r.map(|(description, offsets)| GroupLag {
                    state: description.as_ref().map(|d| d.state.clone()).unwrap_or_default(),
                    description,
                    partitions: offsets
                        .into_iter()
                        .map(|(tp, c)| {
                            let end = ends.get(&tp).copied().unwrap_or(-1);
                            (tp, c, end)
                        })
                        .collect(),
                });
                (g, r)
            })
            .collect())
    }

    /// Offsets of `topic`'s partitions per `spec`.
    pub(crate) async fn topic_offsets(&self, topic: &str, spec: OffsetSpec) -> Result<Vec<(TopicPartition, i64)>> {
        let admin = self.group_admin().await?;
        bounded(self.timeout, "list offsets", admin.topic_offsets(topic, spec)).await
    }

    /// Sizes of the leader copies of `topics`' partitions: every live broker asked once,
    /// concurrently, each within [`SIZES_TIMEOUT`]. `only` asks for just these topics'
    /// partitions (a topic page); otherwise each broker lists all of its replicas.
    pub(crate) async fn sizes(&self, metadata: &Metadata, topics: &[TopicRow], only: bool) -> Sizes {
        let admin = match self.admin().await {
            Ok(a) => a,
            Err(e) => return Sizes { failed: vec![(-1, e)], ..Sizes::default() },
        };
        let mut leaders: HashMap<(String, i32), i32> = HashMap::new();
        for t in topics {
            for p in t.partitions.iter().filter(|p| p.leader >= 0) {
                leaders.insert((t.name.clone(), p.partition), p.leader);
            }
        }
        let asked: Vec<(String, i32)> = if only { leaders.keys().cloned().collect() } else { Vec::new() };
        if only && asked.is_empty() {
            return Sizes::default();
        }
        let limit = SIZES_TIMEOUT.min(self.timeout);
        let mut brokers: Vec<i32> = metadata.brokers.keys().copied().collect();
        brokers.sort_unstable();
        let answers = futures::future::join_all(brokers.into_iter().map(|b| {
            let asked = &asked;
            async move { (b, bounded(limit, "describe log dirs", admin.describe_log_dirs(b, asked)).await) }
        }))
        .await;
        let mut sizes = Sizes::default();
        let mut described = Vec::with_capacity(answers.len());
        for (broker, answer) in answers {
            match answer {
                Ok(dirs) => described.push((broker, dirs)),
                Err(e) => sizes.failed.push((broker, e)),
            }
        }
        sizes.leader_bytes = leader_sizes(&leaders, &described);
        sizes
    }

    pub(crate) async fn reset_offsets(&self, group: &str, offsets: &[(TopicPartition, i64)]) -> Result<()> {
        let admin = self.group_admin().await?;
        bounded(self.timeout, "reset the group's offsets", admin.reset_offsets(group, offsets)).await
    }
}

#[cfg(test)]
mod tests {
    use fjord_client::ReplicaLogDir;

    use super::*;

    fn dir(replicas: &[(&str, i32, i64, bool)]) -> LogDirDescription {
        LogDirDescription {
            path: "/d".into(),
            offline: false,
            replicas: replicas
                .iter()
                .map(|(t, p, size, is_future)| ReplicaLogDir {
                    topic: t.to_string(),
                    partition: *p,
                    size: *size,
                    is_future: *is_future,
                })
                .collect(),
        }
    }

    #[test]
    fn sizes_are_the_leaders_copies_not_followers_or_moves() {
        let leaders = HashMap::from([(("a".to_string(), 0), 1), (("a".to_string(), 1), 2), (("b".to_string(), 0), 3)]);
        let answers = vec![
            // Broker 1 leads a-0 (its copy is moving: the future copy is not the size) and follows a-1.
            (1, vec![dir(&[("a", 0, 100, false), ("a", 1, 999, false)]), dir(&[("a", 0, 40, true)])]),
            (2, vec![dir(&[("a", 1, 200, false), ("a", 0, 999, false)])]),
            // Broker 3 (b-0's leader) did not answer.
        ];
        let sizes = Sizes { leader_bytes: leader_sizes(&leaders, &answers), failed: Vec::new() };
        assert_eq!(sizes.partition("a", 0), Some(100));
        assert_eq!(sizes.partition("a", 1), Some(200));
        assert_eq!(sizes.partition("b", 0), None);
        let row = |name: &str, n: i32| TopicRow {
            name: name.into(),
            partitions: (0..n)
                .map(|p| PartitionRow {
                    partition: p,
                    leader: 1,
                    replicas: vec![],
                    isr: vec![],
                    offline_replicas: vec![],
                    error_code: 0,
                    offsets: None,
                })
                .collect(),
        };
        assert_eq!(sizes.topic(&row("a", 2)), Some(300));
        assert_eq!(sizes.topic(&row("b", 1)), None);
    }
}
