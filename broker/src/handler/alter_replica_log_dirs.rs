//! AlterReplicaLogDirs (API 34, v1-v2): moves replicas of this broker into another of its
//! log dirs (`log.dirs`, JBOD). Needs Alter on the cluster (Kafka).
//!
//! As in Kafka, the answer comes at once and the move runs in the background: the
//! partition is then found in its new directory by DescribeLogDirs. The move itself is
//! [`fjord_log::LogDirs::move_replica`]: the sealed segments are copied while the
//! partition serves, then the partition pauses for the rest (appends in that moment
//! answer NOT_LEADER_OR_FOLLOWER, and clients retry), the copy is renamed into place and
//! opened, and only then is the source deleted. Moves run one at a time, as tasks of the
//! broker's tracker: a broker that stops cancels a move still copying (the copy is
//! deleted, the partition stays where it was) and waits for one in its pause to finish
//! before it closes the logs. While a move copies, DescribeLogDirs lists the copy as the
//! partition's future replica in its new dir.
//!
//! Error codes, per partition: CLUSTER_AUTHORIZATION_FAILED without Alter on the cluster;
//! LOG_DIR_NOT_FOUND for a path that is not one of `log.dirs`; KAFKA_STORAGE_ERROR when
//! that directory or the partition's is offline; UNKNOWN_TOPIC_OR_PARTITION for a
//! partition the cluster does not have; REPLICA_NOT_AVAILABLE when this broker holds no
//! replica of it (Kafka 3's answer; Kafka 2 remembered the wish for a later creation).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fjord_auth::{Operation, Resource};
use fjord_log::TopicPartition;
use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::{AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;

impl Broker {
    pub(crate) fn alter_replica_log_dirs(&self, request: AlterReplicaLogDirsRequest, session: &Session) -> ResponseKind {
        let authorized = self.authorize(session, Operation::Alter, Resource::cluster());
        let logs = self.topics.logs();
        let dirs = logs.dirs();
        let mut results: BTreeMap<String, Vec<AlterReplicaLogDirPartitionResult>> = BTreeMap::new();
        for dir in request.dirs {
            let asked = PathBuf::from(dir.path.as_str());
            let target = dirs.iter().find(|d| same_dir(&d.path, &asked));
            for topic in dir.topics {
                let name = topic.name.0.to_string();
                for partition in topic.partitions {
                    let tp = TopicPartition::new(&name, partition);
                    let code = match target {
                        _ if !authorized => error_code::CLUSTER_AUTHORIZATION_FAILED,
                        None => error_code::LOG_DIR_NOT_FOUND,
                        Some(d) if d.state.is_err() => error_code::KAFKA_STORAGE_ERROR,
                        Some(d) => self.start_move(&tp, &d.path),
                    };
                    results
                        .entry(name.clone())
                        .or_default()
                        .push(AlterReplicaLogDirPartitionResult::default().with_partition_index(partition).with_error_code(code));
                }
            }
        }
        let results = results
            .into_iter()
            .map(|(name, partitions)| {
                AlterReplicaLogDirTopicResult::default()
                    .with_topic_name(TopicName(StrBytes::from_string(name)))
                    .with_partitions(partitions)
            })
            .collect();
        ResponseKind::AlterReplicaLogDirs(AlterReplicaLogDirsResponse::default().with_results(results))
    }

    /// Checks the partition and starts moving its replica into `to` in the background;
    /// the error code to answer.
    fn start_move(&self, tp: &TopicPartition, to: &Path) -> i16 {
        if self.topics.get(&tp.topic).is_none_or(|t| t.partition_replicas(tp.partition).is_none()) {
            return error_code::UNKNOWN_TOPIC_OR_PARTITION;
        }
        let logs = self.topics.logs().clone();
        if logs.is_offline(tp) {
            return error_code::KAFKA_STORAGE_ERROR;
        }
        if self.replicas.get(tp).is_none() || logs.get(tp).is_none() {
            return error_code::REPLICA_NOT_AVAILABLE;
        }
        if logs.dir_of(tp).as_deref() == Some(to) {
            return error_code::NONE;
        }
        let (replicas, tp, to, stop) = (self.replicas.clone(), tp.clone(), to.to_path_buf(), self.stop.clone());
        self.tasks.spawn(async move {
            let moving = (logs.clone(), tp.clone());
            let outcome =
                tokio::task::spawn_blocking(move || moving.0.move_replica(&moving.1, &to, &|| stop.is_cancelled())).await;
            let serving = match outcome {
                Ok(Ok(log)) => Some(log),
                Ok(Err((e @ fjord_log::Error::MoveCancelled { .. }, log))) => {
                    tracing::info!(partition = %tp, reason = %e, "replica move cancelled: the broker stops");
                    log
                }
                Ok(Err((e, log))) => {
                    tracing::error!(partition = %tp, error = %e, "moving a replica to another log dir failed");
                    log
                }
                Err(e) => {
                    tracing::error!(partition = %tp, error = %e, "moving a replica to another log dir panicked");
                    logs.get(&tp)
                }
            };
            // The replica goes on from the log that now holds the partition, wherever it is.
            match serving {
                Some(log) if replicas.get(&tp).is_some_and(|p| !std::sync::Arc::ptr_eq(&p.log, &log)) => {
                    replicas.replace_log(&tp, log)
                }
                Some(_) => {}
                None => {
                    replicas.remove(&tp);
                    replicas.health_changed().notify_one();
                }
            }
        });
        error_code::NONE
    }
}

/// Whether `configured` (one of `log.dirs`) and `asked` (a client's path) name one
/// directory: equal, or equal once both are made canonical.
fn same_dir(configured: &Path, asked: &Path) -> bool {
    configured == asked || matches!((std::fs::canonicalize(configured), std::fs::canonicalize(asked)), (Ok(a), Ok(b)) if a == b)
}
