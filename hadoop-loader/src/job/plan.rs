//! Which partitions a run reads, and from where to where: every partition of the topics
//! the job's pattern matches, from its committed offset (or the log start, if retention
//! deleted what was committed, or nothing was) to the end offset fixed at the start of
//! the run. The arithmetic is [`plan`], a pure function of the committed state and the
//! offsets the brokers reported.

use fjord_client::{Admin, OffsetSpec};

use super::write::PartitionRun;
use super::{JobState, Until};
use crate::{Error, Result};

/// Every partition of the topics whose whole name `pattern` matches (internal topics
/// never), in topic name order, then partition order as the brokers list them.
pub(super) async fn partitions(admin: &Admin, pattern: &regex::Regex) -> Result<Vec<(String, i32)>> {
    let mut topics: Vec<_> =
        admin.list_topics().await?.into_iter().filter(|t| !t.is_internal && pattern.is_match(&t.name)).collect();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(topics.iter().flat_map(|t| t.partitions.iter().map(|p| (t.name.clone(), p.partition))).collect())
}

/// The log start and the end of the read of each of `partitions`, in order: the end is
/// the high watermark, or with [`Until::Timestamp`] the first offset at or after it if
/// that comes earlier.
pub(super) async fn bounds(admin: &Admin, partitions: &[(String, i32)], until: Until) -> Result<(Vec<i64>, Vec<i64>)> {
    let ask = |spec: OffsetSpec| partitions.iter().map(|(t, p)| (t.clone(), *p, spec)).collect::<Vec<_>>();
    let earliest = admin.list_offsets(&ask(OffsetSpec::Earliest)).await?;
    let mut ends = admin.list_offsets(&ask(OffsetSpec::Latest)).await?;
    if let Until::Timestamp(ts) = until {
        let at = admin.list_offsets(&ask(OffsetSpec::Timestamp(ts))).await?;
        for (end, at) in ends.iter_mut().zip(at) {
            *end = (*end).min(at);
        }
    }
    Ok((earliest, ends))
}

/// Where the read of each of `partitions` starts and ends, given their log starts
/// (`earliest`) and read ends (`ends`, both in the order of `partitions`) and the
/// committed `state`. A committed offset below the log start starts at the log start
/// (retention deleted those records before they were loaded: logged); one beyond the log
/// end, when reading to the latest offset, means the topic is not the one the state
/// knows (recreated?) and fails the run.
pub(super) fn plan(
    partitions: &[(String, i32)],
    earliest: &[i64],
    ends: &[i64],
    state: &JobState,
    until: Until,
) -> Result<Vec<PartitionRun>> {
    let mut parts: Vec<PartitionRun> = Vec::with_capacity(partitions.len());
    for (i, (topic, partition)) in partitions.iter().enumerate() {
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
        if start > ends[i] && until == Until::Latest {
            return Err(Error::Inconsistent(format!(
                "{topic}-{partition}: committed offset {start} is beyond the log end {} (topic recreated?)",
                ends[i]
            )));
        }
        parts.push(PartitionRun::new(topic, *partition, start, ends[i]));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(parts: &[PartitionRun]) -> Vec<(String, i32, i64, i64)> {
        parts.iter().map(|p| (p.topic.clone(), p.partition, p.next, p.end)).collect()
    }

    #[test]
    fn a_read_starts_at_the_committed_offset_or_the_log_start() {
        let partitions = [("a".to_string(), 0), ("a".to_string(), 1), ("b".to_string(), 0)];
        let mut state = JobState::default();
        // a-0 committed 5; a-1 committed 2, below its log start 4; b-0 nothing committed.
        state.offsets.insert("a".into(), [(0, 5), (1, 2)].into_iter().collect());
        let parts = plan(&partitions, &[0, 4, 3], &[9, 8, 7], &state, Until::Latest).unwrap();
        assert_eq!(ranges(&parts), [("a".to_string(), 0, 5, 9), ("a".to_string(), 1, 4, 8), ("b".to_string(), 0, 3, 7)]);
        assert!(parts.iter().all(|p| p.records == 0 && p.bad_records == 0));
    }

    #[test]
    fn a_committed_offset_past_the_log_end_fails_only_when_reading_to_the_latest() {
        let partitions = [("a".to_string(), 0)];
        let mut state = JobState::default();
        state.offsets.insert("a".into(), [(0, 12)].into_iter().collect());
        let refused = plan(&partitions, &[0], &[10], &state, Until::Latest);
        assert!(
            matches!(refused, Err(Error::Inconsistent(m)) if m.contains("a-0: committed offset 12 is beyond the log end 10"))
        );
        // Up to a timestamp the end may well be behind what was committed: nothing to read.
        let parts = plan(&partitions, &[0], &[10], &state, Until::Timestamp(1)).unwrap();
        assert_eq!(ranges(&parts), [("a".to_string(), 0, 12, 10)]);
    }
}
