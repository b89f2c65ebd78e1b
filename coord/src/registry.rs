//! The JSON documents stored at the registry paths, and typed reads and writes.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Error, MetadataStore, Result, Stat};

/// `/brokers/ids/<id>`: where a live broker can be reached, on each of its listeners
/// (Kafka's document: `endpoints` and `listener_security_protocol_map`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    /// Advertised host of the inter-broker listener.
    pub host: String,
    /// Advertised port of the inter-broker listener.
    pub port: u16,
    /// Rack, for rack-aware replica placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// Listener URLs named by listener, e.g. `INTERNAL://host:9093`.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Listener name → security protocol (`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, `SASL_SSL`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub listener_security_protocol_map: BTreeMap<String, String>,
}

impl BrokerRegistration {
    /// The advertised host and port of listener `name`. A registration written before
    /// brokers had named listeners (no endpoints) has one, reached at `host:port`.
    pub fn endpoint(&self, name: &str) -> Option<(&str, u16)> {
        if self.endpoints.is_empty() {
            return Some((&self.host, self.port));
        }
        self.endpoints.iter().find_map(|url| {
            let (listener, address) = url.split_once("://")?;
            if !listener.eq_ignore_ascii_case(name) {
                return None;
            }
            let (host, port) = address.rsplit_once(':')?;
            Some((host.trim_start_matches('[').trim_end_matches(']'), port.parse().ok()?))
        })
    }
}

/// `/brokers/topics/<topic>`: replicas of each partition, the first one preferred leader,
/// and the topic's id (KIP-516).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TopicAssignment {
    /// Partition number (as a string, as Kafka writes it) → replica broker ids.
    pub partitions: BTreeMap<String, Vec<i32>>,
    /// The topic id, 16 bytes as 22 URL-safe base64 characters without padding (Kafka's
    /// `topic_id` key and encoding). Set when the topic is created; a topic stored before
    /// ids existed has none until a broker assigns one, once, by compare-and-set on the
    /// node's version. Never changed after: a topic deleted and created again under the
    /// same name gets a new one, which is how clients and replicas tell them apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<String>,
    /// While a partition is being reassigned (KIP-455, Kafka's keys): partition → the
    /// replicas being added. `partitions` then lists the target replicas first, followed
    /// by the original ones not in the target.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub adding_replicas: BTreeMap<String, Vec<i32>>,
    /// While a partition is being reassigned: partition → the replicas being removed
    /// (dropped once every target replica is in the ISR).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub removing_replicas: BTreeMap<String, Vec<i32>>,
}

impl TopicAssignment {
    /// Number of partitions.
    pub fn partition_count(&self) -> usize {
        self.partitions.len()
    }

    /// Replicas of `partition`.
    pub fn replicas(&self, partition: i32) -> Option<&[i32]> {
        self.partitions.get(&partition.to_string()).map(Vec::as_slice)
    }
}

/// `/brokers/topics/<topic>/partitions/<p>/state`: who leads and who is in sync.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// Leader broker id, -1 when none.
    pub leader: i32,
    /// Incremented at every leader change; fences stale leaders.
    pub leader_epoch: i32,
    /// In-sync replicas.
    pub isr: Vec<i32>,
    /// Epoch of the controller that wrote this state.
    pub controller_epoch: i32,
}

/// `/latest_producer_id_block`: the last block of idempotent producer ids a broker
/// claimed (Kafka's document; the bounds are strings there because JSON numbers lose
/// precision above 2^53 in some readers). Brokers claim the next block with a
/// compare-and-set on the node's version, so no two brokers ever share an id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerIdBlock {
    /// Document version, 1.
    pub version: i32,
    /// Broker that claimed the block.
    pub broker: i32,
    /// First id of the block.
    pub block_start: String,
    /// Last id of the block (inclusive).
    pub block_end: String,
}

/// `/cluster/id`: the cluster's id (Kafka's `ClusterIdZNode`, version as a string).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterId {
    /// Document version, `"1"`.
    pub version: String,
    /// The id: 22 URL-safe base64 characters (128 bits).
    pub id: String,
}

/// The cluster id in the store; when there is none yet, `candidate` is created as the id
/// (create-if-absent: of brokers starting together, the first create wins and the others
/// read the winner back).
pub async fn get_or_create_cluster_id(store: &dyn MetadataStore, candidate: &str) -> Result<String> {
    if let Some((doc, _)) = read_json::<ClusterId>(store, crate::paths::CLUSTER_ID).await? {
        return Ok(doc.id);
    }
    let doc = ClusterId { version: "1".into(), id: candidate.into() };
    match crate::create_all(store, crate::paths::CLUSTER_ID, &to_json(&doc), crate::CreateMode::Persistent).await {
        Ok(_) => Ok(doc.id),
        Err(Error::NodeExists { .. }) => match read_json::<ClusterId>(store, crate::paths::CLUSTER_ID).await? {
            Some((doc, _)) => Ok(doc.id),
            // Created and deleted again in between: only an operator does that.
            None => Err(Error::NoNode { path: crate::paths::CLUSTER_ID.into() }),
        },
        Err(e) => Err(e),
    }
}

/// Reads and decodes the JSON document at `path`, with its stat.
pub async fn read_json<T: DeserializeOwned>(store: &dyn MetadataStore, path: &str) -> Result<Option<(T, Stat)>> {
    match store.get(path).await? {
        None => Ok(None),
        Some((data, stat)) => {
            let value = serde_json::from_slice(&data).map_err(|source| Error::Codec { path: path.into(), source })?;
            Ok(Some((value, stat)))
        }
    }
}

/// Encodes `value` as the JSON document for a node.
pub fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("invariant: registry documents always serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_found_by_listener_name() {
        let registration = BrokerRegistration {
            host: "10.0.0.1".into(),
            port: 9093,
            rack: None,
            endpoints: vec!["INTERNAL://10.0.0.1:9093".into(), "EXTERNAL://[::1]:9094".into()],
            listener_security_protocol_map: BTreeMap::from([("INTERNAL".into(), "SSL".into())]),
        };
        assert_eq!(registration.endpoint("INTERNAL"), Some(("10.0.0.1", 9093)));
        assert_eq!(registration.endpoint("external"), Some(("::1", 9094)));
        assert_eq!(registration.endpoint("OTHER"), None);
        let old: BrokerRegistration = serde_json::from_str(r#"{"host":"h","port":1}"#).unwrap();
        assert_eq!(old.endpoint("ANY"), Some(("h", 1)));
        let json = String::from_utf8(to_json(&registration)).unwrap();
        assert!(json.contains(r#""listener_security_protocol_map":{"INTERNAL":"SSL"}"#), "{json}");
    }
}
