//! The group registries in the metadata store (docs/architecture.md): who coordinates a
//! group, its committed offsets, who owns each partition; and the encoding of a group
//! id as one registry node name.

use std::collections::BTreeMap;

use bytes::Bytes;
use fjord_coord::{paths, registry, CreateMode, MetadataStore};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Decodable;
use serde::{Deserialize, Serialize};

use super::offsets::CommittedOffset;
use super::Inner;

#[derive(Serialize, Deserialize)]
struct Holder {
    broker_id: i32,
}

fn unavailable(group_id: &str) -> impl Fn(fjord_coord::Error) -> ResponseError + '_ {
    move |e| {
        tracing::warn!(group = group_id, error = %e, "coordinator registry unavailable");
        ResponseError::CoordinatorNotAvailable
    }
}

impl Inner {
    /// The broker holding `/consumers/<group>/coordinator`, if any; writes nothing.
    pub(super) async fn holder(&self, group_id: &str) -> Result<Option<i32>, ResponseError> {
        let path = paths::group_coordinator(&group_node(group_id));
        let held = registry::read_json::<Holder>(&*self.store, &path).await.map_err(unavailable(group_id))?;
        Ok(held.map(|(holder, _)| holder.broker_id))
    }

    /// Makes sure `/consumers/<group>/coordinator` names a broker, taking it for this
    /// broker if nobody holds it. Returns the holder's broker id.
    pub(super) async fn claim(&self, group_id: &str) -> Result<i32, ResponseError> {
        let path = paths::group_coordinator(&group_node(group_id));
        let store: &dyn MetadataStore = &*self.store;
        let unavailable = unavailable(group_id);
        loop {
            if let Some(holder) = self.holder(group_id).await? {
                return Ok(holder);
            }
            let me = registry::to_json(&Holder { broker_id: self.endpoint.broker_id });
            match fjord_coord::create_all(store, &path, &me, CreateMode::Ephemeral).await {
                Ok(_) => return Ok(self.endpoint.broker_id),
                Err(fjord_coord::Error::NodeExists { .. }) => continue, // someone else won: read who
                Err(e) => return Err(unavailable(e)),
            }
        }
    }

    /// Gives up the coordinator node of a group that left memory without existing (no
    /// members, no offsets) and removes its registry nodes that are then empty, so a
    /// group that came and went leaves nothing behind, as Kafka drops such a group. The
    /// node is left to another broker holding it; nodes with children (offsets a commit
    /// wrote meanwhile) stay. Errors are logged: what stays is only untidy.
    pub(super) async fn release(&self, group_id: &str) {
        if self.groups.lock().expect("groups lock").contains_key(group_id) {
            return;
        }
        let store: &dyn MetadataStore = &*self.store;
        let root = group_root(group_id);
        let node = paths::group_coordinator(&group_node(group_id));
        let gone = |r: fjord_coord::Result<()>| match r {
            Ok(()) | Err(fjord_coord::Error::NoNode { .. }) => true,
            Err(fjord_coord::Error::NotEmpty { .. } | fjord_coord::Error::BadVersion { .. }) => false,
            Err(e) => {
                tracing::debug!(group = group_id, error = %e, "could not remove a gone group's registry nodes");
                false
            }
        };
        match registry::read_json::<Holder>(store, &node).await {
            Ok(Some((holder, stat))) if holder.broker_id == self.endpoint.broker_id => {
                if !gone(store.delete(&node, Some(stat.version)).await) {
                    return;
                }
            }
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => return,
        }
        for path in [format!("{root}/owners"), format!("{root}/offsets"), root.clone()] {
            if !gone(store.delete(&path, None).await) {
                return;
            }
        }
    }

    /// Whether a group this broker does not have in memory exists in the registry
    /// (committed or pending transactional offsets) and is this broker's to list: it
    /// holds the group's coordinator node, or takes it now that nobody does. Reads the
    /// registry's node lists only, not the offsets themselves.
    pub(super) async fn registry_group_is_listed_here(&self, group_id: &str) -> Result<bool, ResponseError> {
        let me = self.endpoint.broker_id;
        let holder = self.holder(group_id).await?;
        if holder.is_some_and(|h| h != me) {
            return Ok(false);
        }
        let store: &dyn MetadataStore = &*self.store;
        let unavailable = unavailable(group_id);
        let root = format!("{}/offsets", group_root(group_id));
        let mut exists = false;
        match store.children(&root).await {
            Ok(topics) => {
                for topic in topics {
                    match store.children(&format!("{root}/{topic}")).await {
                        Ok(partitions) if !partitions.is_empty() => {
                            exists = true;
                            break;
                        }
                        Ok(_) | Err(fjord_coord::Error::NoNode { .. }) => {}
                        Err(e) => return Err(unavailable(e)),
                    }
                }
            }
            Err(fjord_coord::Error::NoNode { .. }) => {}
            Err(e) => return Err(unavailable(e)),
        }
        if !exists {
            exists = !self.load_pending_txn(group_id).await.map_err(&unavailable)?.is_empty();
        }
        if !exists {
            return Ok(false);
        }
        Ok(holder.is_some() || self.claim(group_id).await? == me)
    }

    pub(super) async fn load_offsets(&self, group_id: &str) -> fjord_coord::Result<BTreeMap<(String, i32), CommittedOffset>> {
        let store: &dyn MetadataStore = &*self.store;
        let root = format!("{}/offsets", group_root(group_id));
        let mut offsets = BTreeMap::new();
        let topics = match store.children(&root).await {
            Ok(topics) => topics,
            Err(fjord_coord::Error::NoNode { .. }) => return Ok(offsets),
            Err(e) => return Err(e),
        };
        for topic in topics {
            for partition in store.children(&format!("{root}/{topic}")).await? {
                let Ok(p) = partition.parse::<i32>() else { continue };
                let path = paths::group_offset(&group_node(group_id), &topic, p);
                if let Some((mut committed, stat)) = registry::read_json::<CommittedOffset>(store, &path).await? {
                    // Written before offsets carried their commit time: the node's own
                    // modification time is when it was committed.
                    if committed.commit_timestamp_ms == 0 {
                        committed.commit_timestamp_ms = stat.mtime_ms;
                    }
                    offsets.insert((topic.clone(), p), committed);
                }
            }
        }
        Ok(offsets)
    }

    pub(super) async fn store_offset(
        &self,
        group_id: &str,
        topic: &str,
        partition: i32,
        committed: &CommittedOffset,
    ) -> fjord_coord::Result<()> {
        let path = paths::group_offset(&group_node(group_id), topic, partition);
        set_or_create(&*self.store, &path, &registry::to_json(committed)).await
    }

    /// Rewrites `/consumers/<group>/owners` to show who owns each partition in
    /// `generation` (nothing when `assignments` is empty). Errors are logged: the
    /// registry is informational, the group protocol does not depend on it.
    pub(super) async fn write_owners(
        &self,
        group_id: &str,
        generation: i32,
        protocol_type: Option<&str>,
        assignments: &[(String, Bytes)],
    ) {
        let mut written = self.owners_written.lock().await;
        if written.get(group_id).is_some_and(|&g| g > generation) {
            return;
        }
        written.insert(group_id.to_string(), generation);
        let store: &dyn MetadataStore = &*self.store;
        let root = format!("{}/owners", group_root(group_id));
        if let Err(e) = fjord_coord::delete_all(store, &root).await {
            tracing::warn!(group = group_id, error = %e, "could not clear the ownership registry");
            return;
        }
        if protocol_type != Some("consumer") {
            return;
        }
        for (member_id, assignment) in assignments {
            let Some(partitions) = decode_assignment(assignment) else {
                tracing::debug!(group = group_id, member = %member_id, "assignment is not in the consumer protocol format");
                continue;
            };
            for (topic, partition) in partitions {
                // The assignment is the leader's bytes: a name that is no topic name
                // would be a path of its own making.
                if crate::topics::validate_topic_name(&topic).is_err() {
                    continue;
                }
                let path = paths::group_owner(&group_node(group_id), &topic, partition);
                if let Err(e) = fjord_coord::create_all(store, &path, member_id.as_bytes(), CreateMode::Ephemeral).await {
                    tracing::warn!(group = group_id, path, error = %e, "could not write the ownership registry");
                }
            }
        }
    }
}

/// Writes `data` to the persistent node at `path`, creating it (and its parents) if it
/// is not there; a create that loses a race to another writer sets it after all.
pub(super) async fn set_or_create(store: &dyn MetadataStore, path: &str, data: &[u8]) -> fjord_coord::Result<()> {
    match store.set(path, data, None).await {
        Err(fjord_coord::Error::NoNode { .. }) => {
            match fjord_coord::create_all(store, path, data, CreateMode::Persistent).await {
                Err(fjord_coord::Error::NodeExists { .. }) => store.set(path, data, None).await.map(drop),
                other => other.map(drop),
            }
        }
        other => other.map(drop),
    }
}

/// The (topic, partition) pairs of a consumer-protocol assignment.
fn decode_assignment(bytes: &Bytes) -> Option<Vec<(String, i32)>> {
    let mut buf = bytes.clone();
    if buf.len() < 2 {
        return None;
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = bytes::Buf::get_i16(&mut buf);
    // The group leader, a client, wrote these bytes: walked first, or an array count
    // could abort the broker.
    fjord_record::walk::consumer_assignment(&buf, version.clamp(0, 3), crate::guard::MAX_REQUEST_ELEMENTS).ok()?;
    let assignment = consumer_protocol_assignment::ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3)).ok()?;
    Some(
        assignment
            .assigned_partitions
            .into_iter()
            .flat_map(|tp| {
                let topic = tp.topic.to_string();
                tp.partitions.into_iter().map(move |p| (topic.clone(), p))
            })
            .collect(),
    )
}

/// `/consumers/<group>`, with the group id as [`group_node`] names it.
pub(super) fn group_root(group_id: &str) -> String {
    format!("{}/{}", paths::CONSUMERS, group_node(group_id))
}

/// The registry node name of a group id. Kafka takes almost any string as a group id,
/// and the store's node names cannot be any string: a `/` would make nested nodes (group
/// `a/offsets/t` would write inside group `a`'s offsets), `.` and `..` are not node names,
/// and ZooKeeper refuses control characters and two Unicode ranges. Those characters,
/// and `%` itself so that the name can be read back, are percent-encoded (UTF-8 bytes);
/// every other group id is its own node name, as before. (A group committed before this
/// encoding under a name with `%` in it is read back as the decoded name: see
/// [`group_id_of`].)
pub(super) fn group_node(group_id: &str) -> String {
    if group_id == "." || group_id == ".." {
        return group_id.replace('.', "%2E");
    }
    let escaped = |c: char| {
        c == '/' || c == '%' || c.is_control() || ('\u{E000}'..='\u{F8FF}').contains(&c) || ('\u{FFF0}'..='\u{FFFF}').contains(&c)
    };
    if !group_id.chars().any(escaped) {
        return group_id.to_string();
    }
    let mut node = String::with_capacity(group_id.len() + 8);
    for c in group_id.chars() {
        if escaped(c) {
            let mut utf8 = [0u8; 4];
            for b in c.encode_utf8(&mut utf8).bytes() {
                node.push_str(&format!("%{b:02X}"));
            }
        } else {
            node.push(c);
        }
    }
    node
}

/// The group id a registry node names ([`group_node`] undone). A node whose `%`
/// escapes do not decode is taken as written.
pub(super) fn group_id_of(node: &str) -> String {
    if !node.contains('%') {
        return node.to_string();
    }
    let bytes = node.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex =
                bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                None => return node.to_string(),
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| node.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_become_single_node_names_and_back() {
        for (id, node) in [
            ("plain-group.1", "plain-group.1"),
            ("team/a", "team%2Fa"),
            ("50%", "50%25"),
            (".", "%2E"),
            ("..", "%2E%2E"),
            ("a..b", "a..b"),
            ("tab\there", "tab%09here"),
            ("é ü", "é ü"),
            ("\u{E000}", "%EE%80%80"),
        ] {
            assert_eq!(group_node(id), node, "{id:?}");
            assert_eq!(group_id_of(node), id, "{node:?}");
            assert!(fjord_coord::validate_path(&group_root(id)).is_ok(), "{id:?}");
        }
        // Not written by group_node: taken as it is.
        assert_eq!(group_id_of("100%"), "100%");
        assert_eq!(group_id_of("%zz"), "%zz");
    }

    #[test]
    fn an_assignment_claiming_more_partitions_than_its_bytes_is_skipped_not_allocated() {
        // v1: topics claiming 2^31-1 entries (of ~60 bytes each once decoded), in a few bytes.
        let hostile = Bytes::from_static(&[0, 1, 0x7f, 0xff, 0xff, 0xff, 0, 1, b't', 0, 0, 0, 0]);
        assert_eq!(decode_assignment(&hostile), None);
        let fine = Bytes::from_static(&[0, 1, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(decode_assignment(&fine), Some(vec![("t".to_string(), 3)]));
    }
}
