//! [`GroupAdmin`]: list and describe groups, read and reset their committed offsets.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{GroupId, OffsetCommitRequest, OffsetFetchRequest};

use super::protocol::decode_assignment_bytes;
use super::{s, topic_name, Coordinator, Member};
use crate::cluster::Cluster;
use crate::error::{Error, ResponseError, Result};
use fjord_record::TopicPartition;

/// One member as DescribeGroups reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id` of a static member.
    pub group_instance_id: Option<String>,
    /// `client.id` it sent.
    pub client_id: String,
    /// Host it connected from.
    pub client_host: String,
    /// Partitions decoded from its assignment (empty for non-consumer groups).
    pub assignment: Vec<TopicPartition>,
}

/// A group as DescribeGroups reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// Group id.
    pub group_id: String,
    /// `Empty`, `PreparingRebalance`, `CompletingRebalance`, `Stable` or `Dead`.
    pub state: String,
    /// The agreed assignor.
    pub protocol: String,
    /// Members.
    pub members: Vec<MemberDescription>,
}

/// Group administration: list, describe, read and reset committed offsets.
pub struct GroupAdmin {
    cluster: Arc<Cluster>,
}

impl GroupAdmin {
    /// Connects to the cluster.
    pub async fn connect(config: crate::ClientConfig) -> Result<Self> {
        Ok(Self { cluster: Cluster::connect(crate::ClientConfig { allow_auto_create_topics: false, ..config }).await? })
    }

    fn coordinator_of(&self, group: &str) -> Coordinator {
        let member = Arc::new(Member {
            member_id: Mutex::new(String::new()),
            generation: Mutex::new(-1),
            coordinator: Mutex::new(None),
            rejoin: AtomicBool::new(false),
            joining: AtomicBool::new(false),
            assigned_from: Mutex::new(None),
        });
        Coordinator { cluster: self.cluster.clone(), member, group_id: group.to_string() }
    }

    /// (group id, state) of every group, sorted (one broker answers for the groups it coordinates;
    /// every broker is asked).
    pub async fn list_groups(&self) -> Result<Vec<(String, String)>> {
        let md = self.cluster.refresh(None).await?;
        let mut out = Vec::new();
        for id in md.brokers.keys() {
            let response =
                self.cluster.broker(*id).await?.request(&kafka_protocol::messages::ListGroupsRequest::default(), 4).await?;
            if let Some(e) = Error::kafka(response.error_code, "list groups", None) {
                return Err(e);
            }
            out.extend(response.groups.into_iter().map(|g| (g.group_id.0.to_string(), g.group_state.to_string())));
        }
        out.sort();
        Ok(out)
    }

    /// Members, state and assignments of `group`.
    pub async fn describe_group(&self, group: &str) -> Result<GroupDescription> {
        let conn = self.coordinator_of(group).coordinator().await?;
        let request = kafka_protocol::messages::DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]);
        let response = conn.request(&request, 5).await?;
        let g = response.groups.into_iter().next().ok_or_else(|| Error::Protocol {
            broker: conn.addr().to_string(),
            detail: "DescribeGroups answered no group".into(),
        })?;
        if let Some(e) = Error::kafka(g.error_code, format!("describe group {group}"), g.error_message.map(|m| m.to_string())) {
            return Err(e);
        }
        let consumer = g.protocol_type.as_str() == "consumer";
        let members = g
            .members
            .into_iter()
            .map(|m| MemberDescription {
                assignment: if consumer {
                    decode_assignment_bytes(&m.member_assignment).map(|a| a.into_iter().collect()).unwrap_or_default()
                } else {
                    Vec::new()
                },
                member_id: m.member_id.to_string(),
                group_instance_id: m.group_instance_id.map(|i| i.to_string()),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
            })
            .collect();
        Ok(GroupDescription {
            group_id: group.to_string(),
            state: g.group_state.to_string(),
            protocol: g.protocol_data.to_string(),
            members,
        })
    }

    /// Every committed offset of `group`.
    pub async fn committed_offsets(&self, group: &str) -> Result<BTreeMap<TopicPartition, i64>> {
        let request = OffsetFetchRequest::default().with_group_id(GroupId(s(group))).with_topics(None);
        let response = self.coordinator_of(group).coordinator().await?.request(&request, 7).await?;
        if let Some(e) = Error::kafka(response.error_code, format!("fetch offsets of {group}"), None) {
            return Err(e);
        }
        Ok(response
            .topics
            .into_iter()
            .flat_map(|t| {
                let name = t.name.0.to_string();
                t.partitions
                    .into_iter()
                    .filter(|p| p.committed_offset >= 0)
                    .map(move |p| (TopicPartition::new(&name, p.partition_index), p.committed_offset))
            })
            .collect())
    }

    /// The committed offsets of `partitions` in `group` (absent where none), asked with
    /// `require_stable` (KIP-447): while a transaction that commits offsets of a partition
    /// is not complete, the coordinator answers UNSTABLE_OFFSET_COMMIT and this asks again
    /// (up to the request timeout), so the answer never misses an offset a transaction
    /// already committed. For applications that keep their positions in a group they are
    /// not members of, as the exactly-once mirror does on its target cluster.
    pub async fn stable_committed_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, i64>> {
        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for tp in partitions {
            topics.entry(&tp.topic).or_default().push(tp.partition);
        }
        let request = OffsetFetchRequest::default().with_group_id(GroupId(s(group))).with_require_stable(true).with_topics(Some(
            topics
                .into_iter()
                .map(|(t, p)| OffsetFetchRequestTopic::default().with_name(topic_name(t)).with_partition_indexes(p))
                .collect(),
        ));
        let coordinator = self.coordinator_of(group);
        let deadline = std::time::Instant::now() + self.cluster.config().request_timeout;
        loop {
            let response = coordinator.coordinator().await?.request(&request, 7).await?;
            let mut unstable = response.error_code == ResponseError::UnstableOffsetCommit.code();
            if !unstable {
                if let Some(e) = Error::kafka(response.error_code, format!("fetch offsets of {group}"), None) {
                    return Err(e);
                }
            }
            let mut out = BTreeMap::new();
            for t in &response.topics {
                for p in &t.partitions {
                    let what = || format!("fetch offset of {group} {}-{}", t.name.0.as_str(), p.partition_index);
                    match Error::kafka(p.error_code, what(), None) {
                        Some(e) if e.code() == Some(ResponseError::UnstableOffsetCommit) => unstable = true,
                        Some(e) => return Err(e),
                        None if p.committed_offset >= 0 => {
                            out.insert(TopicPartition::new(t.name.0.as_str(), p.partition_index), p.committed_offset);
                        }
                        None => {}
                    }
                }
            }
            if !unstable {
                return Ok(out);
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::kafka(ResponseError::UnstableOffsetCommit.code(), format!("fetch offsets of {group}"), None)
                    .expect("a non-zero code is an error"));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Log end offsets (the high watermark) of `partitions`, in order.
    pub async fn log_end_offsets(&self, partitions: &[TopicPartition]) -> Result<Vec<i64>> {
        let specs: Vec<(String, i32, crate::OffsetSpec)> =
            partitions.iter().map(|tp| (tp.topic.clone(), tp.partition, crate::OffsetSpec::Latest)).collect();
        crate::admin::list_offsets(&self.cluster, &specs).await
    }

    /// Offsets of `topic`'s partitions per `spec` (earliest, latest or by timestamp).
    pub async fn topic_offsets(&self, topic: &str, spec: crate::OffsetSpec) -> Result<Vec<(TopicPartition, i64)>> {
        let t = self.cluster.topic(topic).await?;
        let specs: Vec<(String, i32, crate::OffsetSpec)> =
            t.partitions.iter().map(|p| (topic.to_string(), p.partition, spec)).collect();
        let offsets = crate::admin::list_offsets(&self.cluster, &specs).await?;
        Ok(t.partitions.iter().map(|p| TopicPartition::new(topic, p.partition)).zip(offsets).collect())
    }

    /// Overwrites `group`'s committed offsets. Only for an empty group: with live
    /// members the coordinator would reject the commit, and the members would
    /// overwrite it anyway, so this refuses with [`Error::InvalidConfig`] first.
    pub async fn reset_offsets(&self, group: &str, offsets: &[(TopicPartition, i64)]) -> Result<()> {
        let description = self.describe_group(group).await?;
        if !description.members.is_empty() {
            return Err(Error::InvalidConfig(format!(
                "group {group} has {} active member(s) (state {}); stop its consumers before resetting offsets",
                description.members.len(),
                description.state
            )));
        }
        let mut topics: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
        for (tp, offset) in offsets {
            topics.entry(&tp.topic).or_default().push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(tp.partition)
                    .with_committed_offset(*offset)
                    .with_committed_leader_epoch(-1),
            );
        }
        // Generation -1 and no member id: an admin commit, accepted only while the group is empty.
        let request =
            OffsetCommitRequest::default().with_group_id(GroupId(s(group))).with_generation_id_or_member_epoch(-1).with_topics(
                topics
                    .into_iter()
                    .map(|(t, p)| OffsetCommitRequestTopic::default().with_name(topic_name(t)).with_partitions(p))
                    .collect(),
            );
        let response = self.coordinator_of(group).coordinator().await?.request(&request, 8).await?;
        for t in response.topics {
            for p in t.partitions {
                if let Some(e) = Error::kafka(
                    p.error_code,
                    format!("reset offset of {group} on {}-{}", t.name.0.as_str(), p.partition_index),
                    None,
                ) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}
