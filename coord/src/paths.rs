//! The registry paths of docs/architecture.md, relative to the store's root (ZooKeeper
//! backends apply the chroot, `/fjord` by default).

/// Default ZooKeeper chroot for a Fjord cluster.
pub const DEFAULT_CHROOT: &str = "/fjord";
/// Parent of the live brokers' ephemeral registrations.
pub const BROKER_IDS: &str = "/brokers/ids";
/// Parent of the topic assignments.
pub const TOPICS: &str = "/brokers/topics";
/// Parent of the topic config overrides.
pub const TOPIC_CONFIGS: &str = "/config/topics";
/// Ephemeral node of the active controller.
pub const CONTROLLER: &str = "/controller";
/// Persistent, monotonic controller epoch.
pub const CONTROLLER_EPOCH: &str = "/controller_epoch";
/// Parent of the consumer groups' registries.
pub const CONSUMERS: &str = "/consumers";
/// Persistent: the last block of producer ids handed to a broker (Kafka's path).
pub const LATEST_PRODUCER_ID_BLOCK: &str = "/latest_producer_id_block";
/// Parent of the per-user configs: SCRAM credentials and client quotas, as Kafka's
/// `/config/users` (`<user>/clients/<client-id>` below a user holds its per-client quotas).
pub const USER_CONFIGS: &str = "/config/users";
/// Parent of the per-client-id quotas, as Kafka's `/config/clients`.
pub const CLIENT_CONFIGS: &str = "/config/clients";
/// Parent of the config change notifications, persistent sequential
/// `config_change_<seq>` nodes naming the entity that changed
/// (`{"version":2,"entity_path":"users/alice/clients/app"}`, Kafka's); brokers watch it
/// to pick up quota changes.
pub const CONFIG_CHANGES: &str = "/config/changes";
/// Parent of the ACLs: `/acls/<resource type>/<pattern type>/<name>` (fjord-auth).
pub const ACLS: &str = "/acls";
/// Parent of the ACL change notifications, persistent sequential `acl_change_<seq>`
/// nodes naming the pattern that changed; brokers watch it (fjord-auth).
pub const ACL_CHANGES: &str = "/acl_changes";
/// Persistent: the cluster's one id (Kafka's path and `{"version":"1","id":...}`
/// document), created once by the first broker that starts.
pub const CLUSTER_ID: &str = "/cluster/id";
/// Parent of schemas by global id.
pub const SCHEMA_IDS: &str = "/schemas/ids";
/// Parent of schema subjects.
pub const SCHEMA_SUBJECTS: &str = "/schemas/subjects";

/// Parent of the brokers' unhealthy replica lists, `<id>` ephemeral (Fjord's; Kafka's
/// controller learns them from LeaderAndIsr answers, which Fjord does not send).
pub const OFFLINE_REPLICAS: &str = "/brokers/offline_replicas";

/// `/brokers/offline_replicas/<id>`: the replicas broker `id` holds that are offline or
/// damaged (ephemeral, absent when there are none).
pub fn offline_replicas(id: i32) -> String {
    format!("{OFFLINE_REPLICAS}/{id}")
}

/// `/brokers/ids/<id>`: a live broker's registration (ephemeral).
pub fn broker(id: i32) -> String {
    format!("{BROKER_IDS}/{id}")
}

/// `/brokers/topics/<topic>`: the replica assignment.
pub fn topic(topic: &str) -> String {
    format!("{TOPICS}/{topic}")
}

/// `/brokers/topics/<topic>/partitions/<p>/state`: leader, epoch, ISR.
pub fn partition_state(topic: &str, partition: i32) -> String {
    format!("{TOPICS}/{topic}/partitions/{partition}/state")
}

/// `/config/topics/<topic>`: topic config overrides.
pub fn topic_config(topic: &str) -> String {
    format!("{TOPIC_CONFIGS}/{topic}")
}

/// `/config/brokers/<id>` and `/config/brokers/<default>`: dynamic broker configs, of
/// one broker and the cluster-wide default (Kafka's layout).
pub const BROKER_CONFIGS: &str = "/config/brokers";

/// `/config/brokers/<node>`: `node` is a broker id or `<default>`.
pub fn broker_config(node: &str) -> String {
    format!("{BROKER_CONFIGS}/{node}")
}

/// `/config/users/<name>`: a user's SCRAM credentials and quotas (`name` already
/// escaped as one path component; `<default>` holds the default user quotas).
pub fn user_config(name: &str) -> String {
    format!("{USER_CONFIGS}/{name}")
}

/// `/config/clients/<client-id>`: a client id's quotas (`name` already escaped as one
/// path component; `<default>` for every client id).
pub fn client_config(name: &str) -> String {
    format!("{CLIENT_CONFIGS}/{name}")
}

/// `/config/users/<user>/clients/<client-id>`: the quotas of one client id of one user
/// (both already escaped; either may be `<default>`).
pub fn user_client_config(user: &str, client_id: &str) -> String {
    format!("{USER_CONFIGS}/{user}/clients/{client_id}")
}

/// `/acls/<resource type>/<pattern type>/<name>`: the ACLs of one resource pattern
/// (`name` already escaped as one path component).
pub fn acl(resource_type: &str, pattern_type: &str, name: &str) -> String {
    format!("{ACLS}/{resource_type}/{pattern_type}/{name}")
}

/// `/consumers/<group>/coordinator`: the group's coordinator (ephemeral).
pub fn group_coordinator(group: &str) -> String {
    format!("{CONSUMERS}/{group}/coordinator")
}

/// `/consumers/<group>/owners/<topic>/<p>`: the partition's owner (ephemeral).
pub fn group_owner(group: &str, topic: &str, partition: i32) -> String {
    format!("{CONSUMERS}/{group}/owners/{topic}/{partition}")
}

/// `/consumers/<group>/offsets/<topic>/<p>`: the committed offset (persistent).
pub fn group_offset(group: &str, topic: &str, partition: i32) -> String {
    format!("{CONSUMERS}/{group}/offsets/{topic}/{partition}")
}

/// `/schemas/ids/<id>`: a schema by global id.
pub fn schema_id(id: i32) -> String {
    format!("{SCHEMA_IDS}/{id}")
}

/// `/schemas/subjects/<subject>`: a subject.
pub fn subject(subject: &str) -> String {
    format!("{SCHEMA_SUBJECTS}/{subject}")
}

/// `/schemas/subjects/<subject>/versions/<v>`: one version of a subject.
pub fn subject_version(subject: &str, version: i32) -> String {
    format!("{SCHEMA_SUBJECTS}/{subject}/versions/{version}")
}
