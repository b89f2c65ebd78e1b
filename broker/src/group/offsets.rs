//! OffsetCommit and OffsetFetch: committed offsets, cached per group and written
//! through to the offset registry.

use std::collections::BTreeMap;
use std::time::Instant;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use serde::{Deserialize, Serialize};

use super::{now_ms, GroupCoordinator};

/// A committed offset as stored in the offset registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct CommittedOffset {
    pub(super) offset: i64,
    #[serde(default = "no_epoch")]
    pub(super) leader_epoch: i32,
    #[serde(default)]
    pub(super) metadata: String,
    #[serde(default)]
    pub(super) commit_timestamp_ms: i64,
}

fn no_epoch() -> i32 {
    -1
}

/// One partition's OffsetFetch answer: its committed offset (`None`: never committed) or
/// the partition's error.
type Fetched = Result<Option<CommittedOffset>, ResponseError>;

impl GroupCoordinator {
    /// OffsetCommit (and the admin's AlterConsumerGroupOffsets, which is one). As in
    /// Kafka, a partition the cluster does not have (`known` says which it has) gets
    /// UNKNOWN_TOPIC_OR_PARTITION and nothing is stored for it, whatever the group's
    /// state; the others are checked against the group ([`Group::check_commit`]) and
    /// stored. A request with no known partition does not touch the group at all.
    pub(crate) async fn offset_commit(
        &self,
        request: OffsetCommitRequest,
        _version: i16,
        known: impl Fn(&str, i32) -> bool,
    ) -> ResponseKind {
        let unknown = ResponseError::UnknownTopicOrPartition.code();
        // Each partition's answer, filled in below where it is not already UNKNOWN_TOPIC_OR_PARTITION.
        let mut codes: Vec<Vec<Option<i16>>> = request
            .topics
            .iter()
            .map(|t| t.partitions.iter().map(|p| (!known(&t.name, p.partition_index)).then_some(unknown)).collect())
            .collect();
        let respond = |codes: Vec<Vec<Option<i16>>>, rest: i16| {
            let topics = request
                .topics
                .iter()
                .zip(codes)
                .map(|(t, codes)| {
                    offset_commit_response::OffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                        t.partitions
                            .iter()
                            .zip(codes)
                            .map(|(p, code)| {
                                offset_commit_response::OffsetCommitResponsePartition::default()
                                    .with_partition_index(p.partition_index)
                                    .with_error_code(code.unwrap_or(rest))
                            })
                            .collect(),
                    )
                })
                .collect();
            ResponseKind::OffsetCommit(OffsetCommitResponse::default().with_topics(topics))
        };
        if codes.iter().flatten().all(Option::is_some) {
            return respond(codes, 0);
        }
        let entry = match self.entry(&request.group_id).await {
            Ok(entry) => entry,
            Err(e) => return respond(codes, e.code()),
        };
        let mut entry = entry.lock().await;
        let generation = request.generation_id_or_member_epoch;
        let check = if !entry.exists() && generation >= 0 {
            // Kafka: a member's commit to a group that does not exist comes from a
            // generation that is gone.
            Err(ResponseError::IllegalGeneration)
        } else {
            entry.group.check_commit(&request.member_id, request.group_instance_id.as_deref(), generation, Instant::now())
        };
        if let Err(e) = check {
            return respond(codes, e.code());
        }
        let now_ms = now_ms();
        for (topic, codes) in request.topics.iter().zip(codes.iter_mut()) {
            for (p, code) in topic.partitions.iter().zip(codes.iter_mut()) {
                if code.is_some() {
                    continue;
                }
                let metadata = p.committed_metadata.as_ref().map(|m| m.to_string()).unwrap_or_default();
                *code = Some(if metadata.len() > self.inner.config.offset_metadata_max_bytes {
                    ResponseError::OffsetMetadataTooLarge.code()
                } else {
                    let committed = CommittedOffset {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata,
                        commit_timestamp_ms: now_ms,
                    };
                    match self.inner.store_offset(&request.group_id, &topic.name, p.partition_index, &committed).await {
                        Ok(()) => {
                            entry.offsets.insert((topic.name.to_string(), p.partition_index), committed);
                            0
                        }
                        Err(e) => {
                            tracing::warn!(group = %request.group_id.as_str(), error = %e, "offset commit failed");
                            ResponseError::CoordinatorNotAvailable.code()
                        }
                    }
                });
            }
        }
        respond(codes, 0)
    }

    /// OffsetFetch. With `require_stable` (v7+, KIP-447) a partition whose offset a
    /// transaction commits and whose marker has not landed yet answers
    /// UNSTABLE_OFFSET_COMMIT (the client retries), as Kafka does; without it, the last
    /// committed offset.
    pub(crate) async fn offset_fetch(&self, request: OffsetFetchRequest, version: i16) -> ResponseKind {
        let stable = version >= 7 && request.require_stable;
        if version >= 8 {
            let mut groups = Vec::with_capacity(request.groups.len());
            for g in &request.groups {
                let wanted =
                    g.topics.as_ref().map(|ts| ts.iter().map(|t| (t.name.clone(), t.partition_indexes.clone())).collect());
                groups.push(self.offset_fetch_group(&g.group_id, wanted, stable).await);
            }
            return ResponseKind::OffsetFetch(OffsetFetchResponse::default().with_groups(groups));
        }
        // Before v8 a request names one group, and the answer carries that group's
        // error code and topics at the top level, in types of their own.
        let wanted = request.topics.as_ref().map(|ts| ts.iter().map(|t| (t.name.clone(), t.partition_indexes.clone())).collect());
        let group = self.offset_fetch_group(&request.group_id, wanted, stable).await;
        let topics = group
            .topics
            .into_iter()
            .map(|t| {
                offset_fetch_response::OffsetFetchResponseTopic::default().with_name(t.name).with_partitions(
                    t.partitions
                        .into_iter()
                        .map(|p| {
                            offset_fetch_response::OffsetFetchResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_committed_offset(p.committed_offset)
                                .with_committed_leader_epoch(p.committed_leader_epoch)
                                .with_metadata(p.metadata)
                                .with_error_code(p.error_code)
                        })
                        .collect(),
                )
            })
            .collect();
        ResponseKind::OffsetFetch(OffsetFetchResponse::default().with_error_code(group.error_code).with_topics(topics))
    }

    /// One group's OffsetFetch answer: the committed offset, leader epoch and metadata of
    /// each requested partition (every committed one when `wanted` is `None`), -1 for a
    /// partition never committed, UNSTABLE_OFFSET_COMMIT for one with a transactional
    /// offset pending when `stable` is asked for; the group's error code and no topics
    /// when the group cannot be read here.
    async fn offset_fetch_group(
        &self,
        group_id: &GroupId,
        wanted: Option<Vec<(TopicName, Vec<i32>)>>,
        stable: bool,
    ) -> offset_fetch_response::OffsetFetchResponseGroup {
        let (code, found) = match self.committed(group_id, wanted, stable).await {
            Ok(found) => (0, found),
            Err(e) => (e.code(), Vec::new()),
        };
        let topics = found
            .into_iter()
            .map(|(name, partitions)| {
                offset_fetch_response::OffsetFetchResponseTopics::default().with_name(name).with_partitions(
                    partitions
                        .into_iter()
                        .map(|(p, c)| {
                            let answer = offset_fetch_response::OffsetFetchResponsePartitions::default().with_partition_index(p);
                            match c {
                                Err(e) => answer
                                    .with_committed_offset(-1)
                                    .with_committed_leader_epoch(-1)
                                    .with_metadata(Some(StrBytes::default()))
                                    .with_error_code(e.code()),
                                Ok(c) => answer
                                    .with_committed_offset(c.as_ref().map_or(-1, |c| c.offset))
                                    .with_committed_leader_epoch(c.as_ref().map_or(-1, |c| c.leader_epoch))
                                    .with_metadata(Some(StrBytes::from_string(c.map(|c| c.metadata).unwrap_or_default()))),
                            }
                        })
                        .collect(),
                )
            })
            .collect();
        offset_fetch_response::OffsetFetchResponseGroup::default()
            .with_group_id(group_id.clone())
            .with_error_code(code)
            .with_topics(topics)
    }

    /// Committed offsets of the requested partitions (all committed ones when
    /// `wanted` is `None`), grouped by topic; `None` for a partition never committed,
    /// UNSTABLE_OFFSET_COMMIT for one with a transactional offset pending when `stable`.
    async fn committed(
        &self,
        group_id: &GroupId,
        wanted: Option<Vec<(TopicName, Vec<i32>)>>,
        stable: bool,
    ) -> Result<Vec<(TopicName, Vec<(i32, Fetched)>)>, ResponseError> {
        // A group that does not exist has nothing committed; looking does not create it.
        let Some(entry) = self.lookup(group_id).await? else {
            return Ok(wanted
                .unwrap_or_default()
                .into_iter()
                .map(|(topic, partitions)| (topic, partitions.into_iter().map(|p| (p, Ok(None))).collect()))
                .collect());
        };
        let entry = entry.lock().await;
        let fetched = |topic: &str, p: i32| {
            if stable && entry.pending_txn.contains(topic, p) {
                Err(ResponseError::UnstableOffsetCommit)
            } else {
                Ok(entry.offsets.get(&(topic.to_owned(), p)).cloned())
            }
        };
        Ok(match wanted {
            Some(wanted) => wanted
                .into_iter()
                .map(|(topic, partitions)| {
                    let found = partitions.into_iter().map(|p| (p, fetched(&topic, p))).collect();
                    (topic, found)
                })
                .collect(),
            None => {
                let mut by_topic: BTreeMap<String, Vec<(i32, Fetched)>> = BTreeMap::new();
                for (topic, p) in entry.offsets.keys() {
                    by_topic.entry(topic.clone()).or_default().push((*p, fetched(topic, *p)));
                }
                by_topic.into_iter().map(|(t, ps)| (TopicName(StrBytes::from_string(t)), ps)).collect()
            }
        })
    }
}
