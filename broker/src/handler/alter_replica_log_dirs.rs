//! AlterReplicaLogDirs (API 34, v1-v2): move replicas of this broker into another of its log
//! directories. Needs Alter on the cluster (Kafka).
//!
//! A broker has one log directory (`log.dirs` with one entry; JBOD is not built), so the
//! only destination is the directory each replica is already in, and asking for it is done
//! at once, as Kafka answers a move to a replica's current directory. Kafka's codes for the
//! rest: LOG_DIR_NOT_FOUND for a path that is not a log directory of this broker,
//! KAFKA_STORAGE_ERROR for an offline replica, REPLICA_NOT_AVAILABLE for a partition this
//! broker holds no replica of. Nothing is ever moved, so nothing changes on disk.

use std::path::Path;

use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::{AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, ResponseKind};

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use fjord_auth::{Operation, Resource};
use fjord_record::TopicPartition;

impl Broker {
    pub(crate) fn alter_replica_log_dirs(&self, request: AlterReplicaLogDirsRequest, session: &Session) -> ResponseKind {
        let authorized = self.authorize(session, Operation::Alter, Resource::cluster());
        let logs = self.topics.logs();
        let mut results: Vec<AlterReplicaLogDirTopicResult> = Vec::new();
        for dir in request.dirs {
            let known = is_log_dir(logs.dir(), dir.path.as_str());
            for topic in dir.topics {
                let partitions = topic
                    .partitions
                    .iter()
                    .map(|&partition| {
                        let tp = TopicPartition::new(topic.name.0.to_string(), partition);
                        let code = if !authorized {
                            error_code::CLUSTER_AUTHORIZATION_FAILED
                        } else if !known {
                            error_code::LOG_DIR_NOT_FOUND
                        } else if logs.is_offline(&tp) {
                            error_code::KAFKA_STORAGE_ERROR
                        } else if logs.get(&tp).is_none() {
                            error_code::REPLICA_NOT_AVAILABLE
                        } else {
                            error_code::NONE
                        };
                        AlterReplicaLogDirPartitionResult::default().with_partition_index(partition).with_error_code(code)
                    })
                    .collect();
                results.push(AlterReplicaLogDirTopicResult::default().with_topic_name(topic.name).with_partitions(partitions));
            }
        }
        ResponseKind::AlterReplicaLogDirs(AlterReplicaLogDirsResponse::default().with_results(results))
    }
}

/// Whether `asked` names the log directory `dir`: as DescribeLogDirs reports it, or as its
/// absolute path (Kafka compares absolute paths, without resolving links).
fn is_log_dir(dir: &Path, asked: &str) -> bool {
    let asked = Path::new(asked);
    asked == dir || std::path::absolute(dir).is_ok_and(|absolute| asked == absolute)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_dir_is_named_as_reported_or_by_its_absolute_path() {
        assert!(is_log_dir(Path::new("/var/lib/fjord"), "/var/lib/fjord"));
        assert!(is_log_dir(Path::new("/var/lib/fjord"), "/var/lib/fjord/"));
        let absolute = std::env::current_dir().unwrap().join("data");
        assert!(is_log_dir(Path::new("data"), absolute.to_str().unwrap()));
        assert!(is_log_dir(Path::new("data"), "data"));
        assert!(!is_log_dir(Path::new("/var/lib/fjord"), "/var/lib/other"));
        assert!(!is_log_dir(Path::new("/var/lib/fjord"), "/var/lib/fjord/t-0"));
        assert!(!is_log_dir(Path::new("/var/lib/fjord"), ""));
    }
}
