//! Topic ids (KIP-516): 16 random bytes given to a topic when it is created, kept in its
//! assignment node (`/brokers/topics/<t>`, key `topic_id`, Kafka's encoding: 22 URL-safe
//! base64 characters without padding) and never changed. A topic deleted and created
//! again under the same name gets a new id, so a client that cached the old topic (its
//! partition count, its offsets) sees that it is another topic: librdkafka resets its
//! partitions on an id change, where an unchanged name alone makes it keep producing to
//! partitions the new topic may not have.
//!
//! A topic stored before ids existed has none; the first broker whose view reads it
//! assigns one with a compare-and-set on the node's version ([`assign_missing`]), so of
//! brokers racing, one id wins and every view reads that one back.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use fjord_coord::registry::{to_json, TopicAssignment};
use fjord_coord::{paths, MetadataStore};
use uuid::Uuid;

/// Kafka's reserved id of its metadata topic (`Uuid.METADATA_TOPIC_ID`): never handed out.
const METADATA_TOPIC_ID: Uuid = Uuid::from_u64_pair(0, 1);

/// A new random topic id. Like Kafka's `Uuid.randomUuid`, never the nil id (which means
/// "no id" on the wire), never the reserved metadata topic id, and never one whose text
/// starts with `-` (it would read as a flag on a command line).
pub(crate) fn new_topic_id() -> Uuid {
    loop {
        let mut bytes = [0u8; 16];
        rand::fill(&mut bytes[..]);
        let id = Uuid::from_bytes(bytes);
        if !id.is_nil() && id != METADATA_TOPIC_ID && !encode(id).starts_with('-') {
            return id;
        }
    }
}

/// The id as stored and shown: 22 URL-safe base64 characters, no padding (Kafka's
/// `Uuid.toString`).
pub(crate) fn encode(id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(id.as_bytes())
}

/// The id from its stored text; `None` unless it is exactly 16 bytes of URL-safe base64.
pub(crate) fn decode(text: &str) -> Option<Uuid> {
    let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
    Some(Uuid::from_bytes(bytes.try_into().ok()?))
}

/// Gives the topic whose assignment (read at znode `version`) has no id a new one, by a
/// compare-and-set on that version: when another broker (or a partition increase) wrote
/// the node first, nothing is written here and the caller's watch re-reads the node.
/// Returns the id written, if this call wrote it.
pub(crate) async fn assign_missing(
    store: &dyn MetadataStore,
    name: &str,
    assignment: &TopicAssignment,
    version: i32,
) -> fjord_coord::Result<Option<Uuid>> {
    if assignment.topic_id.is_some() {
        return Ok(None);
    }
    let id = new_topic_id();
    let updated = TopicAssignment { topic_id: Some(encode(id)), ..assignment.clone() };
    match store.set(&paths::topic(name), &to_json(&updated), Some(version)).await {
        Ok(_) => Ok(Some(id)),
        // Someone else wrote (or deleted) the node since it was read: their write stands.
        Err(fjord_coord::Error::BadVersion { .. } | fjord_coord::Error::NoNode { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_and_round_trip_in_kafkas_text_form() {
        let ids: std::collections::BTreeSet<Uuid> = (0..1000).map(|_| new_topic_id()).collect();
        assert_eq!(ids.len(), 1000, "1000 ids, all different");
        for id in ids {
            assert!(!id.is_nil() && id != METADATA_TOPIC_ID);
            let text = encode(id);
            assert_eq!(text.len(), 22, "{text}");
            assert!(!text.starts_with('-'), "{text}");
            assert_eq!(decode(&text), Some(id));
        }
        // Kafka's text of the reserved metadata topic id.
        assert_eq!(encode(METADATA_TOPIC_ID), "AAAAAAAAAAAAAAAAAAAAAQ");
        for bad in ["", "AAAA", "AAAAAAAAAAAAAAAAAAAAAQ==", "AAAAAAAAAAAAAAAAAAAAAQAA", "!!!!!!!!!!!!!!!!!!!!!!", "é"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_missing_id_is_assigned_once_and_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::EmbeddedStore::open(&dir.path().join("store")).unwrap();
        let path = paths::topic("old");
        let old = TopicAssignment { partitions: [("0".to_string(), vec![1])].into(), topic_id: None, ..Default::default() };
        fjord_coord::create_all(&store, &path, &to_json(&old), fjord_coord::CreateMode::Persistent).await.unwrap();
        let (read, stat) = fjord_coord::registry::read_json::<TopicAssignment>(&store, &path).await.unwrap().unwrap();
        let won = assign_missing(&store, "old", &read, stat.version).await.unwrap().expect("the first assignment writes");
        // A second broker that read the same (stale) version loses the race.
        assert_eq!(assign_missing(&store, "old", &read, stat.version).await.unwrap(), None);
        let (stored, stat) = fjord_coord::registry::read_json::<TopicAssignment>(&store, &path).await.unwrap().unwrap();
        assert_eq!(stored.topic_id.as_deref().and_then(decode), Some(won));
        assert_eq!(stored.partitions, old.partitions, "the assignment itself is kept");
        // With an id present nothing is written, whatever the version.
        assert_eq!(assign_missing(&store, "old", &stored, stat.version).await.unwrap(), None);
        assert_eq!(fjord_coord::registry::read_json::<TopicAssignment>(&store, &path).await.unwrap().unwrap().0, stored);
        // Gone meanwhile: nothing to do, no error.
        assert_eq!(assign_missing(&store, "gone", &old, 0).await.unwrap(), None);
    }
}
