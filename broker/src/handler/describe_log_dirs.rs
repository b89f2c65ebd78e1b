//! DescribeLogDirs (API 35, v1-v4): this broker's log directories (`log.dirs`, one result
//! each, in order), and in each its replicas' size on disk, offset lag and whether it is a
//! future replica, for every partition asked (all when the request's topic list is null).
//! Needs Describe on the cluster (Kafka). An offline log dir (it failed with an I/O
//! error) is listed with KAFKA_STORAGE_ERROR and nothing in it, as Kafka lists it.
//!
//! The offset lag is Kafka's for a current replica, `max(high watermark - log
//! end offset, 0)`. While an AlterReplicaLogDirs move copies a replica, its copy (the
//! `-future` directory) is listed in its new dir with `is_future_key` and the bytes copied
//! so far, its offset lag -1 (not known: the copy is files, not a log yet); the partition
//! shows there as a current replica once the move is done. v4's
//! total and usable bytes come from statvfs(2) of the directory, -1 when that fails.
//! A partition asked for that this broker holds no replica of is left out, as Kafka does.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use fjord_auth::{Operation, Resource};
use fjord_log::{FutureReplica, LogDirInfo};

impl Broker {
    pub(crate) fn describe_log_dirs(&self, request: DescribeLogDirsRequest, version: i16, session: &Session) -> ResponseKind {
        if !self.authorize(session, Operation::Describe, Resource::cluster()) {
            // v3+ has a top-level error; before it, Kafka answers no results.
            return ResponseKind::DescribeLogDirs(DescribeLogDirsResponse::default().with_error_code(if version >= 3 {
                error_code::CLUSTER_AUTHORIZATION_FAILED
            } else {
                error_code::NONE
            }));
        }
        // None: every partition; Some: only these (topic → partitions).
        let wanted: Option<BTreeMap<String, BTreeSet<i32>>> = request.topics.map(|topics| {
            let mut wanted: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
            for t in topics {
                wanted.entry(t.topic.0.to_string()).or_default().extend(t.partitions);
            }
            wanted
        });
        let logs = self.topics.logs();
        let future = logs.future_replica();
        let results = logs.dirs().iter().map(|dir| describe_dir(dir, wanted.as_ref(), future.as_ref())).collect();
        ResponseKind::DescribeLogDirs(DescribeLogDirsResponse::default().with_results(results))
    }
}

/// One log dir's result: its partitions (those `wanted`, all when `None`) with their sizes
/// and offset lags, the copy of a move into it (`future`, when it is this dir's), and the
/// disk's total and usable bytes.
fn describe_dir(
    dir: &LogDirInfo,
    wanted: Option<&BTreeMap<String, BTreeSet<i32>>>,
    future: Option<&FutureReplica>,
) -> DescribeLogDirsResult {
    let logs = match &dir.state {
        Ok(logs) => logs,
        // An offline dir (Kafka): its path and KAFKA_STORAGE_ERROR, nothing else.
        Err(_) => {
            return DescribeLogDirsResult::default()
                .with_error_code(error_code::KAFKA_STORAGE_ERROR)
                .with_log_dir(StrBytes::from_string(dir.path.display().to_string()))
                .with_total_bytes(-1)
                .with_usable_bytes(-1)
        }
    };
    let mut topics: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    let mut held = logs.partitions();
    held.sort();
    let is_wanted =
        |tp: &fjord_log::TopicPartition| wanted.is_none_or(|w| w.get(&tp.topic).is_some_and(|p| p.contains(&tp.partition)));
    for tp in held {
        if !is_wanted(&tp) {
            continue;
        }
        // Deleted since listed: nothing to describe.
        let Some(log) = logs.get(&tp) else { continue };
        let lag = (log.high_watermark() - log.log_end_offset()).max(0);
        topics.entry(tp.topic.clone()).or_default().push(
            DescribeLogDirsPartition::default()
                .with_partition_index(tp.partition)
                .with_partition_size(i64::try_from(log.size_bytes()).unwrap_or(i64::MAX))
                .with_offset_lag(lag)
                .with_is_future_key(false),
        );
    }
    if let Some(f) = future.filter(|f| f.log_dir == dir.path && is_wanted(&f.partition)) {
        topics.entry(f.partition.topic.clone()).or_default().push(
            DescribeLogDirsPartition::default()
                .with_partition_index(f.partition.partition)
                .with_partition_size(i64::try_from(f.size_bytes).unwrap_or(i64::MAX))
                .with_offset_lag(-1)
                .with_is_future_key(true),
        );
    }
    let (total_bytes, usable_bytes) = disk_space(&dir.path).unwrap_or((-1, -1));
    DescribeLogDirsResult::default()
        .with_error_code(error_code::NONE)
        .with_log_dir(StrBytes::from_string(dir.path.display().to_string()))
        .with_topics(
            topics
                .into_iter()
                .map(|(name, partitions)| {
                    DescribeLogDirsTopic::default().with_name(TopicName(StrBytes::from_string(name))).with_partitions(partitions)
                })
                .collect(),
        )
        // v4+; the codec leaves them out of older versions.
        .with_total_bytes(total_bytes)
        .with_usable_bytes(usable_bytes)
}

/// (total, usable) bytes of the file system holding `dir`; usable is what an
/// unprivileged writer may still use (statvfs's `f_bavail`, as Kafka's `getUsableSpace`).
// The statvfs field types are u64 on Linux but narrower elsewhere.
#[allow(clippy::useless_conversion)]
fn disk_space(dir: &std::path::Path) -> Option<(i64, i64)> {
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    let block = u64::from(stat.fragment_size());
    let bytes = |blocks: u64| i64::try_from(blocks.saturating_mul(block)).unwrap_or(i64::MAX);
    Some((bytes(u64::from(stat.blocks())), bytes(u64::from(stat.blocks_available()))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_space_is_read_and_usable_is_at_most_total() {
        let dir = tempfile::tempdir().unwrap();
        let (total, usable) = disk_space(dir.path()).unwrap();
        assert!(total > 0 && (0..=total).contains(&usable), "total {total}, usable {usable}");
        assert_eq!(disk_space(&dir.path().join("missing")), None);
    }
}
