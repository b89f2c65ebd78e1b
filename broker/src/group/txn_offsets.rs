//! Transactional offset commits: TxnOffsetCommit keeps a producer's offsets pending, and
//! the transaction's marker applies them (commit) or drops them (abort).
//!
//! Pending offsets live in the metadata store, next to the committed ones, at
//! `/txn_offsets/<producer id>/<group>`, one document per producer and group. So they
//! survive a restart of the group's coordinator between the commit of the offsets and
//! the marker (the transaction coordinator resends markers until they land), and the
//! marker needs no more than the producer id to find them: a marker for
//! [`crate::txn::GROUP_MARKER_TOPIC`] completes every group this broker coordinates that
//! holds pending offsets of the producer.
//!
//! The group's entry also knows which of its partitions have offsets pending
//! ([`PendingPartitions`], read back from the store when a broker takes the group on), so
//! OffsetFetch with `require_stable` (v7+, KIP-447) answers UNSTABLE_OFFSET_COMMIT for
//! them until the marker lands, as Kafka does: EndTxn is answered once the commit is
//! prepared, and a consumer that reads its group's offsets right after (librdkafka asks
//! with `require_stable` when read_committed) retries instead of reading the offsets from
//! before the transaction.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use fjord_coord::{registry, MetadataStore};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::txn_offset_commit_response::{TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic};
use kafka_protocol::messages::{ResponseKind, TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use serde::{Deserialize, Serialize};

use super::offsets::CommittedOffset;
use super::registry::{group_id_of, group_node, set_or_create};
use super::{now_ms, GroupCoordinator, GroupEntry, Inner};

/// Root of the pending transactional offsets in the metadata store.
const ROOT: &str = "/txn_offsets";

/// One producer's pending offsets for one group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Pending {
    producer_epoch: i16,
    offsets: Vec<PendingOffset>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PendingOffset {
    topic: String,
    partition: i32,
    committed: CommittedOffset,
}

/// A group's partitions with transactional offsets pending, by producer id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct PendingPartitions(BTreeMap<i64, BTreeSet<(String, i32)>>);

impl PendingPartitions {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a producer has an offset pending for the partition.
    pub(super) fn contains(&self, topic: &str, partition: i32) -> bool {
        self.0.values().any(|ps| ps.iter().any(|(t, p)| t == topic && *p == partition))
    }

    fn set(&mut self, producer_id: i64, pending: &Pending) {
        let partitions: BTreeSet<(String, i32)> = pending.offsets.iter().map(|o| (o.topic.clone(), o.partition)).collect();
        if partitions.is_empty() {
            self.0.remove(&producer_id);
        } else {
            self.0.insert(producer_id, partitions);
        }
    }

    fn remove(&mut self, producer_id: i64) {
        self.0.remove(&producer_id);
    }

    /// The producers with an offset of the partition pending.
    fn producers_of(&self, topic: &str, partition: i32) -> Vec<i64> {
        self.0.iter().filter(|(_, ps)| ps.iter().any(|(t, p)| t == topic && *p == partition)).map(|(id, _)| *id).collect()
    }
}

impl Inner {
    /// The group's pending transactional offsets as the store holds them: one look per
    /// producer with offsets pending for any group (producers of open transactions).
    pub(super) async fn load_pending_txn(&self, group_id: &str) -> fjord_coord::Result<PendingPartitions> {
        let store: &dyn MetadataStore = &*self.store;
        let producers = match store.children(ROOT).await {
            Ok(producers) => producers,
            Err(fjord_coord::Error::NoNode { .. }) => return Ok(PendingPartitions::default()),
            Err(e) => return Err(e),
        };
        let mut found = PendingPartitions::default();
        for producer in producers {
            let Ok(producer_id) = producer.parse::<i64>() else { continue };
            if let Some((pending, _)) = registry::read_json::<Pending>(store, &pending_path(producer_id, group_id)).await? {
                found.set(producer_id, &pending);
            }
        }
        Ok(found)
    }
}

impl GroupEntry {
    /// Drops every producer's pending offset of the partition (OffsetDelete): as Kafka's
    /// group coordinator removes pending transactional offsets with the committed one, so
    /// a transaction committed after the delete does not bring the offset back. The
    /// transaction itself is untouched; its marker finds less to apply.
    pub(super) async fn drop_pending_offset(
        &mut self,
        store: &dyn MetadataStore,
        group_id: &str,
        topic: &str,
        partition: i32,
    ) -> fjord_coord::Result<()> {
        for producer_id in self.pending_txn.producers_of(topic, partition) {
            let path = pending_path(producer_id, group_id);
            let Some((mut pending, stat)) = registry::read_json::<Pending>(store, &path).await? else {
                self.pending_txn.remove(producer_id);
                continue;
            };
            pending.offsets.retain(|o| !(o.topic == topic && o.partition == partition));
            // Conditional on the version read: a TxnOffsetCommit in between (it holds the
            // group's lock too, so only another broker's stale view) fails this instead of
            // being overwritten.
            store.set(&path, &registry::to_json(&pending), Some(stat.version)).await?;
            self.pending_txn.set(producer_id, &pending);
        }
        Ok(())
    }
}

fn producer_root(producer_id: i64) -> String {
    format!("{ROOT}/{producer_id}")
}

fn pending_path(producer_id: i64, group_id: &str) -> String {
    format!("{ROOT}/{producer_id}/{}", group_node(group_id))
}

impl GroupCoordinator {
    /// The broker coordinating `group_id`, claiming it for this broker when nobody does
    /// (as FindCoordinator would): where a transaction's marker for the group goes.
    pub(crate) async fn coordinator_of(&self, group_id: &str) -> Option<i32> {
        self.inner.claim(group_id).await.ok()
    }

    /// TxnOffsetCommit: checks the group as OffsetCommit does (a member that names a
    /// generation must be in it), then keeps the offsets pending for the producer.
    /// `known` says which partitions the cluster has.
    pub(crate) async fn txn_offset_commit(
        &self,
        request: TxnOffsetCommitRequest,
        version: i16,
        known: impl Fn(&str, i32) -> bool,
    ) -> ResponseKind {
        let respond = |codes: &dyn Fn(&str, i32) -> i16| {
            let topics = request
                .topics
                .iter()
                .map(|t| {
                    TxnOffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                        t.partitions
                            .iter()
                            .map(|p| {
                                TxnOffsetCommitResponsePartition::default()
                                    .with_partition_index(p.partition_index)
                                    .with_error_code(codes(&t.name, p.partition_index))
                            })
                            .collect(),
                    )
                })
                .collect();
            ResponseKind::TxnOffsetCommit(TxnOffsetCommitResponse::default().with_topics(topics))
        };
        let fenced = |e: ResponseError| {
            // KIP-588: clients before TxnOffsetCommit v3 know INVALID_PRODUCER_EPOCH only.
            if e == ResponseError::ProducerFenced && version < 3 {
                ResponseError::InvalidProducerEpoch.code()
            } else {
                e.code()
            }
        };
        let entry = match self.entry(&request.group_id).await {
            Ok(entry) => entry,
            Err(e) => return respond(&|_, _| fenced(e)),
        };
        let mut entry = entry.lock().await;
        if version >= 3 && (request.generation_id >= 0 || !request.member_id.is_empty()) {
            let instance = request.group_instance_id.as_deref();
            if let Err(e) = entry.group.check_commit(&request.member_id, instance, request.generation_id, Instant::now()) {
                return respond(&|_, _| e.code());
            }
        }
        let producer_id = request.producer_id.0;
        let path = pending_path(producer_id, &request.group_id);
        let store: &dyn MetadataStore = &*self.inner.store;
        let mut pending = match registry::read_json::<Pending>(store, &path).await {
            Ok(found) => found.map(|(p, _)| p).filter(|p| p.producer_epoch <= request.producer_epoch).unwrap_or_default(),
            Err(e) => {
                tracing::warn!(group = %request.group_id.as_str(), error = %e, "pending offsets unreadable");
                return respond(&|_, _| ResponseError::CoordinatorNotAvailable.code());
            }
        };
        pending.producer_epoch = request.producer_epoch;
        let mut codes: BTreeMap<(String, i32), i16> = BTreeMap::new();
        let now = now_ms();
        for topic in &request.topics {
            for p in &topic.partitions {
                let key = (topic.name.to_string(), p.partition_index);
                let metadata = p.committed_metadata.as_ref().map(|m| m.to_string()).unwrap_or_default();
                let code = if !known(&topic.name, p.partition_index) {
                    ResponseError::UnknownTopicOrPartition.code()
                } else if metadata.len() > self.inner.config.offset_metadata_max_bytes {
                    ResponseError::OffsetMetadataTooLarge.code()
                } else {
                    pending.offsets.retain(|o| (o.topic.as_str(), o.partition) != (key.0.as_str(), key.1));
                    pending.offsets.push(PendingOffset {
                        topic: key.0.clone(),
                        partition: key.1,
                        committed: CommittedOffset {
                            offset: p.committed_offset,
                            leader_epoch: p.committed_leader_epoch,
                            metadata,
                            commit_timestamp_ms: now,
                        },
                    });
                    0
                };
                codes.insert(key, code);
            }
        }
        if codes.values().any(|&c| c == 0) {
            let data = registry::to_json(&pending);
            if let Err(e) = set_or_create(store, &path, &data).await {
                tracing::warn!(group = %request.group_id.as_str(), error = %e, "pending offsets not written");
                return respond(&|_, _| ResponseError::CoordinatorNotAvailable.code());
            }
            entry.pending_txn.set(producer_id, &pending);
        }
        drop(entry);
        respond(&|topic, p| codes.get(&(topic.to_owned(), p)).copied().unwrap_or(0))
    }

    /// A transaction marker for the producer's offsets: on commit its pending offsets
    /// become the committed ones of every group this broker coordinates; on abort they
    /// are dropped. `Err` when the store failed (the coordinator sends the marker again).
    // Called by the WriteTxnMarkers handler for `crate::txn::GROUP_MARKER_TOPIC`.
    pub(crate) async fn complete_txn_offsets(&self, producer_id: i64, commit: bool) -> Result<(), ResponseError> {
        let store: &dyn MetadataStore = &*self.inner.store;
        let unavailable = |e: fjord_coord::Error| {
            tracing::warn!(producer_id, error = %e, "pending offsets unavailable");
            ResponseError::CoordinatorNotAvailable
        };
        let root = producer_root(producer_id);
        let nodes = match store.children(&root).await {
            Ok(nodes) => nodes,
            Err(fjord_coord::Error::NoNode { .. }) => return Ok(()),
            Err(e) => return Err(unavailable(e)),
        };
        for node in nodes {
            let group_id = group_id_of(&node);
            let entry = match self.entry(&group_id).await {
                Ok(entry) => entry,
                // Another broker coordinates the group: the marker for it goes there.
                Err(ResponseError::NotCoordinator) => continue,
                Err(e) => return Err(e),
            };
            let mut entry = entry.lock().await;
            let path = format!("{root}/{node}");
            let Some((pending, _)) = registry::read_json::<Pending>(store, &path).await.map_err(unavailable)? else {
                entry.pending_txn.remove(producer_id);
                continue;
            };
            if commit {
                for p in pending.offsets {
                    self.inner.store_offset(&group_id, &p.topic, p.partition, &p.committed).await.map_err(unavailable)?;
                    entry.offsets.insert((p.topic, p.partition), p.committed);
                }
            }
            match store.delete(&path, None).await {
                Ok(()) | Err(fjord_coord::Error::NoNode { .. }) => {}
                Err(e) => return Err(unavailable(e)),
            }
            entry.pending_txn.remove(producer_id);
        }
        // Other brokers' groups may still be under it: then it stays.
        let _ = store.delete(&root, None).await;
        Ok(())
    }
}
