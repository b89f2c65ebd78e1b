//! Request authorization (`authorizer.enable`) over a SASL_PLAINTEXT listener, with
//! `User:admin` as the super user and `User:bob` as an ordinary client: each API answers
//! Kafka's *_AUTHORIZATION_FAILED code until an ACL created through CreateAcls allows
//! it, and the change is enforced within two seconds. A PLAINTEXT listener serves
//! `User:ANONYMOUS`. Clients: confluent-kafka (librdkafka) and raw protocol requests.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{produce_request, topic_name, RawClient};
use fjord_auth::{Operation, PatternType, Permission, ResourceType, ScramMechanism};
use fjord_record::BatchBuilder;
use fjord_testkit::StandaloneBroker;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
const GROUP_AUTHORIZATION_FAILED: i16 = 30;
const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
const ADMIN_PASSWORD: &str = "admin-secret";
const BOB_PASSWORD: &str = "bob-secret";

struct SecuredBroker {
    broker: StandaloneBroker,
}

impl SecuredBroker {
    /// SASL_PLAINTEXT and PLAINTEXT listeners, users `admin` (super user) and `bob`.
    async fn start() -> Self {
        common::init_tracing();
        let broker = StandaloneBroker::builder()
            .set("listeners", "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0")
            .set("inter.broker.listener.name", "PLAINTEXT")
            .set("sasl.enabled.mechanisms", "SCRAM-SHA-256,PLAIN")
            .set("authorizer.enable", "true")
            .set("super.users", "User:admin")
            .user_with("admin", ADMIN_PASSWORD, &[ScramMechanism::Sha256])
            .user_with("bob", BOB_PASSWORD, &[ScramMechanism::Sha256])
            .start()
            .await
            .unwrap();
        Self { broker }
    }

    /// A raw connection authenticated as `user` with SASL PLAIN.
    async fn login(&self, user: &str, password: &str) -> RawClient {
        let mut client = RawClient::connect(self.broker.listener("SASL_PLAINTEXT")).await.unwrap();
        let handshake = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN"));
        let answer: SaslHandshakeResponse = client.call(ApiKey::SaslHandshake, 1, &handshake).await.unwrap();
        assert_eq!(answer.error_code, 0);
        let token = Bytes::from(format!("\0{user}\0{password}"));
        let request = SaslAuthenticateRequest::default().with_auth_bytes(token);
        let answer: SaslAuthenticateResponse = client.call(ApiKey::SaslAuthenticate, 2, &request).await.unwrap();
        assert_eq!(answer.error_code, 0, "{user} did not authenticate");
        client
    }

    async fn admin(&self) -> RawClient {
        self.login("admin", ADMIN_PASSWORD).await
    }

    async fn stop(self) {
        self.broker.stop().await.unwrap();
    }
}

async fn create_topic(client: &mut RawClient, name: &str) -> i16 {
    let request = CreateTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![CreatableTopic::default()
        .with_name(topic_name(name))
        .with_num_partitions(1)
        .with_replication_factor(1)]);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 5, &request).await.unwrap();
    response.topics[0].error_code
}

/// CreateAcls of one literal Allow ACL for `principal` from any host: the error code.
async fn allow(client: &mut RawClient, principal: &str, operation: Operation, resource: ResourceType, name: &str) -> i16 {
    let creation = AclCreation::default()
        .with_resource_type(resource.code())
        .with_resource_name(StrBytes::from_string(name.to_owned()))
        .with_resource_pattern_type(PatternType::Literal.code())
        .with_principal(StrBytes::from_string(principal.to_owned()))
        .with_host(StrBytes::from_static_str("*"))
        .with_operation(operation.code())
        .with_permission_type(Permission::Allow.code());
    let request = CreateAclsRequest::default().with_creations(vec![creation]);
    let response: CreateAclsResponse = client.call(ApiKey::CreateAcls, 2, &request).await.unwrap();
    response.results[0].error_code
}

fn batch(value: &str) -> Bytes {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    builder.append(1_700_000_000_000, Some(b"k"), Some(value.as_bytes()), &[]);
    builder.build()
}

async fn produce(client: &mut RawClient, topic: &str) -> i16 {
    client.produce(7, &produce_request(topic, 0, 1, 5000, batch("v"))).await.0
}

/// Metadata of every topic (`None`) or of `names`: (name, error code) per topic.
async fn metadata(client: &mut RawClient, names: Option<&[&str]>) -> Vec<(String, i16)> {
    let topics =
        names.map(|names| names.iter().map(|n| MetadataRequestTopic::default().with_name(Some(topic_name(n)))).collect());
    let request = MetadataRequest::default().with_topics(topics).with_allow_auto_topic_creation(false);
    let response: MetadataResponse = client.call(ApiKey::Metadata, 9, &request).await.unwrap();
    response.topics.iter().map(|t| (t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default(), t.error_code)).collect()
}

#[tokio::test]
async fn confluent_kafka_producer_and_consumer_need_their_acls() {
    let broker = SecuredBroker::start().await;
    assert_eq!(create_topic(&mut broker.admin().await, "orders").await, 0);
    let script = r#"
import sys
from confluent_kafka import Producer, Consumer, KafkaError
from confluent_kafka.admin import (AdminClient, AclBinding, ResourceType, ResourcePatternType, AclOperation,
                                   AclPermissionType)
bootstrap, admin_password, bob_password = sys.argv[1], sys.argv[2], sys.argv[3]
def as_user(user, password, **extra):
    conf = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": user, "sasl.password": password}
    conf.update(extra)
    return conf

def produce_one(value):
    results = []
    p = Producer(as_user("bob", bob_password, **{"message.timeout.ms": 10000}))
    p.produce("orders", value=value, on_delivery=lambda err, msg: results.append(err))
    p.flush(20)
    assert len(results) == 1, results
    return results[0]

# No ACL: the write is refused with TOPIC_AUTHORIZATION_FAILED.
err = produce_one(b"refused")
assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

admin = AdminClient(as_user("admin", admin_password))
acl = lambda op: AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:bob", "*", op,
                            AclPermissionType.ALLOW)
for f in admin.create_acls([acl(AclOperation.WRITE), acl(AclOperation.READ)]).values():
    f.result(10)

# Write on the topic now allows it (the watcher applies the ACL within a second or two).
err = produce_one(b"accepted")
assert err is None, err

# Read on the topic but nothing on the group: GROUP_AUTHORIZATION_FAILED.
c = Consumer(as_user("bob", bob_password, **{"group.id": "billing", "auto.offset.reset": "earliest"}))
c.subscribe(["orders"])
seen = None
for _ in range(20):
    m = c.poll(1)
    if m is not None and m.error() is not None:
        seen = m.error()
        break
c.close()
assert seen is not None and seen.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, seen
print("ok")
"#;
    let addr = broker.broker.listener("SASL_PLAINTEXT").to_string();
    common::run_python(script, &[&addr, ADMIN_PASSWORD, BOB_PASSWORD], Duration::from_secs(120)).await;
    broker.stop().await;
}

/// Metadata (v9) of one topic, asking for auto-creation: its error code.
async fn metadata_creating(client: &mut RawClient, name: &str) -> i16 {
    let request = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(topic_name(name)))]))
        .with_allow_auto_topic_creation(true);
    let response: MetadataResponse = client.call(ApiKey::Metadata, 9, &request).await.unwrap();
    response.topics[0].error_code
}

/// Write on every topic creates none (#19): a Produce to a missing topic answers
/// UNKNOWN_TOPIC_OR_PARTITION and a Metadata asking for auto-creation
/// TOPIC_AUTHORIZATION_FAILED (Kafka's codes), and librdkafka's producer, which asks
/// Metadata to create, reports TOPIC_AUTHORIZATION_FAILED; the admin's listing then shows
/// that none of those topics exists. Once `bob` also has Create on the cluster, the same
/// Produce, Metadata and librdkafka producer each create their topic. (Without an
/// authorizer, a Produce auto-creates as before: protocol.rs's round trip produces into a
/// topic nobody created.)
#[tokio::test]
async fn write_alone_creates_no_topic_create_does() {
    const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    assert_eq!(create_topic(&mut admin, "existing").await, 0);
    assert_eq!(allow(&mut admin, "User:bob", Operation::Write, ResourceType::Topic, "*").await, 0);
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while produce(&mut bob, "existing").await != 0 {
        assert!(Instant::now() < deadline, "the Write ACL never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(produce(&mut bob, "raw-produce").await, UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(metadata_creating(&mut bob, "raw-metadata").await, TOPIC_AUTHORIZATION_FAILED);
    // Auto-creation not asked for: the missing topic is just unknown.
    assert_eq!(metadata(&mut bob, Some(&["raw-metadata"])).await, vec![("raw-metadata".to_owned(), UNKNOWN_TOPIC_OR_PARTITION)]);
    let script = r#"
import sys
from confluent_kafka import Producer, KafkaError
bootstrap, password, topic, expect_created = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "yes"
results = []
p = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
              "sasl.username": "bob", "sasl.password": password, "message.timeout.ms": 10000})
p.produce(topic, value=b"v", on_delivery=lambda err, msg: results.append(err))
p.flush(20)
assert len(results) == 1, results
if expect_created:
    assert results[0] is None, results[0]
else:
    assert results[0] is not None and results[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, results[0]
print("ok")
"#;
    let addr = broker.broker.listener("SASL_PLAINTEXT").to_string();
    common::run_python(script, &[&addr, BOB_PASSWORD, "by-librdkafka", "no"], Duration::from_secs(60)).await;
    let mut listed: Vec<String> = metadata(&mut admin, None).await.into_iter().map(|(name, _)| name).collect();
    listed.sort();
    assert_eq!(listed, ["existing"], "a topic was created with Write alone");

    assert_eq!(allow(&mut admin, "User:bob", Operation::Create, ResourceType::Cluster, "kafka-cluster").await, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while produce(&mut bob, "raw-produce").await != 0 {
        assert!(Instant::now() < deadline, "the Create ACL never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metadata_creating(&mut bob, "raw-metadata").await, 0);
    common::run_python(script, &[&addr, BOB_PASSWORD, "by-librdkafka", "yes"], Duration::from_secs(60)).await;
    let mut listed: Vec<String> = metadata(&mut admin, None).await.into_iter().map(|(name, _)| name).collect();
    listed.sort();
    assert_eq!(listed, ["by-librdkafka", "existing", "raw-metadata", "raw-produce"]);
    broker.stop().await;
}

#[tokio::test]
async fn metadata_and_describe_topic_partitions_hide_topics_the_principal_may_not_describe() {
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    for topic in ["visible", "hidden"] {
        assert_eq!(create_topic(&mut admin, topic).await, 0);
    }
    assert_eq!(allow(&mut admin, "User:bob", Operation::Describe, ResourceType::Topic, "visible").await, 0);
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let listed = loop {
        let listed = metadata(&mut bob, None).await;
        if !listed.is_empty() || Instant::now() > deadline {
            break listed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(listed, vec![("visible".to_owned(), 0)]);
    assert_eq!(metadata(&mut bob, Some(&["hidden"])).await, vec![("hidden".to_owned(), TOPIC_AUTHORIZATION_FAILED)]);
    let mut all: Vec<String> = metadata(&mut admin, None).await.into_iter().map(|(name, _)| name).collect();
    all.sort();
    assert_eq!(all, ["hidden", "visible"]);
    // DescribeTopicPartitions answers as Metadata: every topic means the describable ones,
    // a named hidden topic is TOPIC_AUTHORIZATION_FAILED without its id.
    assert_eq!(describe_topic_partitions(&mut bob, &[]).await, vec![("visible".to_owned(), 0, true)]);
    assert_eq!(
        describe_topic_partitions(&mut bob, &["hidden", "visible"]).await,
        vec![("visible".to_owned(), 0, true), ("hidden".to_owned(), TOPIC_AUTHORIZATION_FAILED, false)]
    );
    assert_eq!(describe_topic_partitions(&mut admin, &[]).await.len(), 2);
    broker.stop().await;
}

/// DescribeTopicPartitions of every topic (`[]`) or of `names`: (name, error code, has an
/// id) per topic.
async fn describe_topic_partitions(client: &mut RawClient, names: &[&str]) -> Vec<(String, i16, bool)> {
    use kafka_protocol::messages::describe_topic_partitions_request::TopicRequest;
    let request = DescribeTopicPartitionsRequest::default()
        .with_topics(names.iter().map(|n| TopicRequest::default().with_name(topic_name(n))).collect())
        .with_response_partition_limit(100);
    let response: DescribeTopicPartitionsResponse = client.call(ApiKey::DescribeTopicPartitions, 0, &request).await.unwrap();
    response
        .topics
        .iter()
        .map(|t| (t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default(), t.error_code, !t.topic_id.is_nil()))
        .collect()
}

#[tokio::test]
async fn an_allowed_anonymous_client_cannot_delete_a_topic_or_alter_its_config() {
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    assert_eq!(create_topic(&mut admin, "shared").await, 0);
    for operation in [Operation::Read, Operation::Write] {
        assert_eq!(allow(&mut admin, "User:ANONYMOUS", operation, ResourceType::Topic, "shared").await, 0);
    }
    let mut anonymous = RawClient::connect(broker.broker.listener("PLAINTEXT")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while produce(&mut anonymous, "shared").await != 0 {
        assert!(Instant::now() < deadline, "the Write ACL never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let delete = DeleteTopicsRequest::default().with_timeout_ms(5000).with_topic_names(vec![topic_name("shared")]);
    let response: DeleteTopicsResponse = anonymous.call(ApiKey::DeleteTopics, 4, &delete).await.unwrap();
    assert_eq!(response.responses[0].error_code, TOPIC_AUTHORIZATION_FAILED);

    let alter = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(StrBytes::from_static_str("shared"))
        .with_configs(vec![AlterableConfig::default()
            .with_name(StrBytes::from_static_str("retention.ms"))
            .with_config_operation(0)
            .with_value(Some(StrBytes::from_static_str("1")))])]);
    let response: IncrementalAlterConfigsResponse = anonymous.call(ApiKey::IncrementalAlterConfigs, 1, &alter).await.unwrap();
    assert_eq!(response.responses[0].error_code, TOPIC_AUTHORIZATION_FAILED);
    let grow = CreatePartitionsRequest::default().with_timeout_ms(5000).with_topics(vec![
        kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic::default()
            .with_name(topic_name("shared"))
            .with_count(3),
    ]);
    let response: CreatePartitionsResponse = anonymous.call(ApiKey::CreatePartitions, 1, &grow).await.unwrap();
    assert_eq!(response.results[0].error_code, TOPIC_AUTHORIZATION_FAILED);
    // DeleteRecords needs Delete on the topic.
    let trim = kafka_protocol::messages::DeleteRecordsRequest::default().with_timeout_ms(5000).with_topics(vec![
        kafka_protocol::messages::delete_records_request::DeleteRecordsTopic::default()
            .with_name(topic_name("shared"))
            .with_partitions(vec![kafka_protocol::messages::delete_records_request::DeleteRecordsPartition::default()
                .with_partition_index(0)
                .with_offset(-1)]),
    ]);
    let response: kafka_protocol::messages::DeleteRecordsResponse =
        anonymous.call(ApiKey::DeleteRecords, 2, &trim).await.unwrap();
    assert_eq!(response.topics[0].partitions[0].error_code, TOPIC_AUTHORIZATION_FAILED);
    // WriteTxnMarkers needs ClusterAction on the cluster (the brokers', a super user's).
    let abort = WriteTxnMarkersRequest::default().with_markers(vec![write_txn_markers_request::WritableTxnMarker::default()
        .with_producer_id(ProducerId(5))
        .with_topics(vec![write_txn_markers_request::WritableTxnMarkerTopic::default()
            .with_name(topic_name("shared"))
            .with_partition_indexes(vec![0])])]);
    let response: WriteTxnMarkersResponse = anonymous.call(ApiKey::WriteTxnMarkers, 1, &abort).await.unwrap();
    assert_eq!(response.markers[0].topics[0].partitions[0].error_code, CLUSTER_AUTHORIZATION_FAILED);
    assert_eq!(admin.latest_offset("shared").await, (0, 1), "nothing written");
    let response: WriteTxnMarkersResponse = admin.call(ApiKey::WriteTxnMarkers, 1, &abort).await.unwrap();
    assert_eq!(response.markers[0].topics[0].partitions[0].error_code, 0);
    assert_eq!(admin.latest_offset("shared").await, (0, 2));
    // Client quotas: AlterConfigs on the cluster to set one, DescribeConfigs to list them.
    let quota = AlterClientQuotasRequest::default().with_entries(vec![alter_client_quotas_request::EntryData::default()
        .with_entity(vec![alter_client_quotas_request::EntityData::default()
            .with_entity_type(StrBytes::from_static_str("user"))
            .with_entity_name(Some(StrBytes::from_static_str("ANONYMOUS")))])
        .with_ops(vec![alter_client_quotas_request::OpData::default()
            .with_key(StrBytes::from_static_str("producer_byte_rate"))
            .with_value(1e9)])]);
    let response: AlterClientQuotasResponse = anonymous.call(ApiKey::AlterClientQuotas, 1, &quota).await.unwrap();
    assert_eq!(response.entries[0].error_code, CLUSTER_AUTHORIZATION_FAILED);
    let list = DescribeClientQuotasRequest::default();
    let response: DescribeClientQuotasResponse = anonymous.call(ApiKey::DescribeClientQuotas, 1, &list).await.unwrap();
    assert_eq!(response.error_code, CLUSTER_AUTHORIZATION_FAILED);
    let response: DescribeClientQuotasResponse = admin.call(ApiKey::DescribeClientQuotas, 1, &list).await.unwrap();
    assert_eq!((response.error_code, response.entries.map(|e| e.len())), (0, Some(0)), "nothing stored");
    let response: AlterClientQuotasResponse = admin.call(ApiKey::AlterClientQuotas, 1, &quota).await.unwrap();
    assert_eq!(response.entries[0].error_code, 0);
    // Nor may it grant itself more.
    assert_eq!(
        allow(&mut anonymous, "User:ANONYMOUS", Operation::All, ResourceType::Cluster, "kafka-cluster").await,
        CLUSTER_AUTHORIZATION_FAILED
    );

    // The topic is still there, with its default retention.
    assert_eq!(metadata(&mut admin, Some(&["shared"])).await, vec![("shared".to_owned(), 0)]);
    let describe = DescribeConfigsRequest::default().with_resources(vec![
        kafka_protocol::messages::describe_configs_request::DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("shared"))
            .with_configuration_keys(Some(vec![StrBytes::from_static_str("retention.ms")])),
    ]);
    let response: DescribeConfigsResponse = admin.call(ApiKey::DescribeConfigs, 1, &describe).await.unwrap();
    assert_eq!(response.results[0].error_code, 0);
    assert_ne!(response.results[0].configs[0].value.as_deref(), Some("1"));
    broker.stop().await;
}

#[tokio::test]
async fn an_acl_created_through_create_acls_is_enforced_within_two_seconds() {
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    assert_eq!(create_topic(&mut admin, "events").await, 0);
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    assert_eq!(produce(&mut bob, "events").await, TOPIC_AUTHORIZATION_FAILED);
    // bob may not create ACLs himself.
    assert_eq!(allow(&mut bob, "User:bob", Operation::Write, ResourceType::Topic, "events").await, CLUSTER_AUTHORIZATION_FAILED);
    assert_eq!(produce(&mut bob, "events").await, TOPIC_AUTHORIZATION_FAILED);

    assert_eq!(allow(&mut admin, "User:bob", Operation::Write, ResourceType::Topic, "events").await, 0);
    let created = Instant::now();
    while produce(&mut bob, "events").await != 0 {
        assert!(created.elapsed() < Duration::from_secs(2), "the ACL was not enforced within 2 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("ACL enforced {:?} after CreateAcls answered", created.elapsed());
    broker.stop().await;
}

#[tokio::test]
async fn find_coordinator_needs_describe_on_the_group() {
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    assert_eq!(allow(&mut admin, "User:bob", Operation::Read, ResourceType::Group, "mine").await, 0);
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    let single = |key: &'static str| FindCoordinatorRequest::default().with_key(StrBytes::from_static_str(key));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let response: FindCoordinatorResponse = bob.call(ApiKey::FindCoordinator, 3, &single("mine")).await.unwrap();
        if response.error_code == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the group ACL never applied: {}", response.error_code);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let response: FindCoordinatorResponse = bob.call(ApiKey::FindCoordinator, 3, &single("theirs")).await.unwrap();
    assert_eq!(response.error_code, GROUP_AUTHORIZATION_FAILED);
    let batched = FindCoordinatorRequest::default()
        .with_coordinator_keys(vec![StrBytes::from_static_str("mine"), StrBytes::from_static_str("theirs")]);
    let response: FindCoordinatorResponse = bob.call(ApiKey::FindCoordinator, 4, &batched).await.unwrap();
    let codes: Vec<(String, i16)> = response.coordinators.iter().map(|c| (c.key.to_string(), c.error_code)).collect();
    assert_eq!(codes, [("mine".to_owned(), 0), ("theirs".to_owned(), GROUP_AUTHORIZATION_FAILED)]);
    broker.stop().await;
}

/// OffsetForLeaderEpoch with a replica id from a client that is no broker (not on the
/// inter-broker listener, not its principal) is a client's request: Describe on the
/// topic is checked. A replica id once let any client skip it.
#[tokio::test]
async fn offset_for_leader_epoch_with_a_replica_id_from_a_client_needs_describe() {
    use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    assert_eq!(create_topic(&mut admin, "epochs").await, 0);
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    let ask = |replica_id: i32| {
        OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(replica_id)).with_topics(vec![
            OffsetForLeaderTopic::default().with_topic(topic_name("epochs")).with_partitions(vec![
                OffsetForLeaderPartition::default().with_partition(0).with_current_leader_epoch(-1).with_leader_epoch(0),
            ]),
        ])
    };
    for replica_id in [-1, 0, 1] {
        let answer: OffsetForLeaderEpochResponse = bob.call(ApiKey::OffsetForLeaderEpoch, 4, &ask(replica_id)).await.unwrap();
        assert_eq!(answer.topics[0].partitions[0].error_code, TOPIC_AUTHORIZATION_FAILED, "replica id {replica_id}");
    }
    // With Describe, bob gets the answer (and the replica id changes nothing).
    assert_eq!(allow(&mut admin, "User:bob", Operation::Describe, ResourceType::Topic, "epochs").await, 0);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let answer: OffsetForLeaderEpochResponse = bob.call(ApiKey::OffsetForLeaderEpoch, 4, &ask(0)).await.unwrap();
        if answer.topics[0].partitions[0].error_code == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the Describe ACL was not applied: {answer:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    broker.stop().await;
}

/// OffsetDelete (#22) needs Delete on the group, else the whole request is
/// GROUP_AUTHORIZATION_FAILED, and Read on each topic, else its partitions are
/// TOPIC_AUTHORIZATION_FAILED; a refused offset stays committed.
#[tokio::test]
async fn offset_delete_needs_delete_on_the_group_and_read_on_each_topic() {
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    for topic in ["open", "secret"] {
        assert_eq!(create_topic(&mut admin, topic).await, 0);
    }
    let partition = |topic: &'static str| (topic_name(topic), 0);
    let commit = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("shared")))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(
            [partition("open"), partition("secret")]
                .into_iter()
                .map(|(name, p)| {
                    offset_commit_request::OffsetCommitRequestTopic::default().with_name(name).with_partitions(vec![
                        offset_commit_request::OffsetCommitRequestPartition::default()
                            .with_partition_index(p)
                            .with_committed_offset(5),
                    ])
                })
                .collect(),
        );
    let committed: OffsetCommitResponse = admin.call(ApiKey::OffsetCommit, 8, &commit).await.unwrap();
    assert!(committed.topics.iter().flat_map(|t| &t.partitions).all(|p| p.error_code == 0));
    let delete = OffsetDeleteRequest::default().with_group_id(GroupId(StrBytes::from_static_str("shared"))).with_topics(
        ["open", "secret"]
            .into_iter()
            .map(|topic| {
                offset_delete_request::OffsetDeleteRequestTopic::default()
                    .with_name(topic_name(topic))
                    .with_partitions(vec![offset_delete_request::OffsetDeleteRequestPartition::default()])
            })
            .collect(),
    );
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    // (top-level error, per-topic error) of bob's OffsetDelete once `ready` says the ACLs
    // created last are in force (they apply within two seconds).
    async fn bob_deletes(
        bob: &mut RawClient,
        delete: &OffsetDeleteRequest,
        ready: impl Fn(&OffsetDeleteResponse) -> bool,
    ) -> (i16, Vec<(String, i16)>) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let response: OffsetDeleteResponse = bob.call(ApiKey::OffsetDelete, 0, delete).await.unwrap();
            if ready(&response) || Instant::now() > deadline {
                let topics = response.topics.iter().map(|t| (t.name.to_string(), t.partitions[0].error_code)).collect();
                return (response.error_code, topics);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let answer = bob_deletes(&mut bob, &delete, |_| true).await;
    assert_eq!(answer, (GROUP_AUTHORIZATION_FAILED, vec![]));
    assert_eq!(allow(&mut admin, "User:bob", Operation::Delete, ResourceType::Group, "shared").await, 0);
    let answer = bob_deletes(&mut bob, &delete, |r| r.error_code == 0).await;
    let denied = vec![("open".to_owned(), TOPIC_AUTHORIZATION_FAILED), ("secret".to_owned(), TOPIC_AUTHORIZATION_FAILED)];
    assert_eq!(answer, (0, denied));
    assert_eq!(allow(&mut admin, "User:bob", Operation::Read, ResourceType::Topic, "open").await, 0);
    let answer = bob_deletes(&mut bob, &delete, |r| r.topics.iter().any(|t| t.partitions[0].error_code == 0)).await;
    assert_eq!(answer, (0, vec![("open".to_owned(), 0), ("secret".to_owned(), TOPIC_AUTHORIZATION_FAILED)]));

    let fetch = OffsetFetchRequest::default().with_groups(vec![offset_fetch_request::OffsetFetchRequestGroup::default()
        .with_group_id(GroupId(StrBytes::from_static_str("shared")))
        .with_topics(None)]);
    let fetched: OffsetFetchResponse = admin.call(ApiKey::OffsetFetch, 8, &fetch).await.unwrap();
    let left: Vec<(String, i64)> = fetched.groups[0]
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.to_string(), p.committed_offset)))
        .collect();
    assert_eq!(left, [("secret".to_owned(), 5)], "only the permitted offset went");
    broker.stop().await;
}

/// Produce requests of 64 KB until one's throttle_time_ms is `throttled`, for at most
/// `within`: whether it was.
async fn throttled_within(client: &mut RawClient, topic: &str, throttled: bool, within: Duration) -> bool {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    builder.append(1_700_000_000_000, None, Some(&[7u8; 65536]), &[]);
    let request = produce_request(topic, 0, 1, 5000, builder.build());
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let response: ProduceResponse = client.call(ApiKey::Produce, 7, &request).await.unwrap();
        assert_eq!(response.responses[0].partition_responses[0].error_code, 0);
        if (response.throttle_time_ms > 0) == throttled {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A user quota applies to the SASL principal: bob over his 40 KB/s is throttled, the
/// admin on the same listener is not.
#[tokio::test]
async fn a_user_quota_applies_to_the_authenticated_principal() {
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    assert_eq!(create_topic(&mut admin, "metered").await, 0);
    assert_eq!(allow(&mut admin, "User:bob", Operation::Write, ResourceType::Topic, "metered").await, 0);
    let quota = AlterClientQuotasRequest::default().with_entries(vec![alter_client_quotas_request::EntryData::default()
        .with_entity(vec![alter_client_quotas_request::EntityData::default()
            .with_entity_type(StrBytes::from_static_str("user"))
            .with_entity_name(Some(StrBytes::from_static_str("bob")))])
        .with_ops(vec![alter_client_quotas_request::OpData::default()
            .with_key(StrBytes::from_static_str("producer_byte_rate"))
            .with_value(40960.0)])]);
    let response: AlterClientQuotasResponse = admin.call(ApiKey::AlterClientQuotas, 1, &quota).await.unwrap();
    assert_eq!(response.entries[0].error_code, 0);
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    // The Write ACL reaches the authorizer within moments.
    let deadline = Instant::now() + Duration::from_secs(5);
    while produce(&mut bob, "metered").await != 0 {
        assert!(Instant::now() < deadline, "the Write ACL never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(throttled_within(&mut bob, "metered", true, Duration::from_secs(10)).await, "bob was never throttled");
    assert!(!throttled_within(&mut admin, "metered", true, Duration::from_secs(2)).await, "bob's quota throttled the admin");
    broker.stop().await;
}

#[tokio::test]
async fn list_config_resources_needs_describe_configs_on_the_cluster() {
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    assert_eq!(create_topic(&mut admin, "configured").await, 0);
    assert_eq!(list_topic_config_resources(&mut admin).await, (0, vec!["configured".to_owned()]));
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    assert_eq!(list_topic_config_resources(&mut bob).await, (CLUSTER_AUTHORIZATION_FAILED, Vec::new()));
    broker.stop().await;
}

/// ListConfigResources v1 of the topics: (error code, names).
async fn list_topic_config_resources(client: &mut RawClient) -> (i16, Vec<String>) {
    let request = ListConfigResourcesRequest::default().with_resource_types(vec![2]);
    let response: ListConfigResourcesResponse = client.call(ApiKey::ListConfigResources, 1, &request).await.unwrap();
    (response.error_code, response.config_resources.iter().map(|r| r.resource_name.to_string()).collect())
}

#[tokio::test]
async fn update_features_needs_alter_on_the_cluster() {
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    assert_eq!(update_features(&mut bob).await, (CLUSTER_AUTHORIZATION_FAILED, Vec::new()));
    // The admin gets past the check to the per-feature answer (no feature is supported),
    // once the broker is the controller (NOT_CONTROLLER, 41, before).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut answer = update_features(&mut admin).await;
    while answer.0 == 41 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        answer = update_features(&mut admin).await;
    }
    assert_eq!(answer, (0, vec![42]));
    broker.stop().await;
}

/// UpdateFeatures v1 upgrading `metadata.version`: (top-level error, per-feature errors).
async fn update_features(client: &mut RawClient) -> (i16, Vec<i16>) {
    use kafka_protocol::messages::update_features_request::FeatureUpdateKey;
    let request = UpdateFeaturesRequest::default().with_feature_updates(vec![FeatureUpdateKey::default()
        .with_feature(StrBytes::from_static_str("metadata.version"))
        .with_max_version_level(20)
        .with_upgrade_type(1)]);
    let response: UpdateFeaturesResponse = client.call(ApiKey::UpdateFeatures, 1, &request).await.unwrap();
    (response.error_code, response.results.iter().map(|r| r.error_code).collect())
}

/// Kafka: a Produce holding transactional batches needs Write on the transactional id
/// it names, beside Write on the topic; else the whole request is refused.
#[tokio::test]
async fn transactional_batches_need_write_on_their_transactional_id() {
    const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    assert_eq!(create_topic(&mut admin, "t").await, 0);
    assert_eq!(allow(&mut admin, "User:bob", Operation::Write, ResourceType::Topic, "t").await, 0);
    // The coordinators' topic exists once an id was looked up (before, a verification
    // has no coordinator to ask and answers NOT_ENOUGH_REPLICAS, a retry).
    let lookup = FindCoordinatorRequest::default().with_key_type(1).with_coordinator_keys(vec![StrBytes::from_static_str("app")]);
    let found: FindCoordinatorResponse = admin.call(ApiKey::FindCoordinator, 4, &lookup).await.unwrap();
    assert_eq!(found.coordinators[0].error_code, 0);
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    let mut transactional = BatchBuilder::new(1_700_000_000_000).producer(4_000, 0, 0).transactional();
    transactional.append(1_700_000_000_000, None, Some(b"v"), &[]);
    let request = produce_request("t", 0, -1, 5000, transactional.build())
        .with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("app"))));
    let deadline = Instant::now() + Duration::from_secs(5);
    while produce(&mut bob, "t").await != 0 {
        assert!(Instant::now() < deadline, "the topic ACL never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(bob.produce(7, &request).await.0, TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    assert_eq!(allow(&mut admin, "User:bob", Operation::Write, ResourceType::TransactionalId, "app").await, 0);
    // Allowed, the batch goes on to the coordinator's check: no producer has that id.
    let code = loop {
        let code = bob.produce(7, &request).await.0;
        if code != TRANSACTIONAL_ID_AUTHORIZATION_FAILED || Instant::now() > deadline + Duration::from_secs(5) {
            break code;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, INVALID_PRODUCER_ID_MAPPING);
    assert_eq!(admin.latest_offset("t").await, (0, 1), "only bob's plain record was written");
    broker.stop().await;
}

/// Kafka: WriteTxnMarkers from Alter on the cluster (an admin aborting a hanging
/// transaction, `fjord transactions abort`) or ClusterAction; else refused, nothing written.
#[tokio::test]
async fn write_txn_markers_needs_alter_on_the_cluster() {
    use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
    let broker = SecuredBroker::start().await;
    let mut admin = broker.admin().await;
    assert_eq!(create_topic(&mut admin, "t").await, 0);
    let mut bob = broker.login("bob", BOB_PASSWORD).await;
    let abort = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(4_000))
        .with_producer_epoch(0)
        .with_transaction_result(false)
        .with_coordinator_epoch(-1)
        .with_topics(vec![WritableTxnMarkerTopic::default().with_name(topic_name("t")).with_partition_indexes(vec![0])])]);
    let code = |r: WriteTxnMarkersResponse| r.markers[0].topics[0].partitions[0].error_code;
    let refused: WriteTxnMarkersResponse = bob.call(ApiKey::WriteTxnMarkers, 1, &abort).await.unwrap();
    assert_eq!(code(refused), CLUSTER_AUTHORIZATION_FAILED);
    assert_eq!(admin.latest_offset("t").await, (0, 0));
    assert_eq!(allow(&mut admin, "User:bob", Operation::Alter, ResourceType::Cluster, "kafka-cluster").await, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r: WriteTxnMarkersResponse = bob.call(ApiKey::WriteTxnMarkers, 1, &abort).await.unwrap();
        match code(r) {
            0 => break,
            c => assert!(c == CLUSTER_AUTHORIZATION_FAILED && Instant::now() < deadline, "{c}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(admin.latest_offset("t").await, (0, 1), "the marker");
    broker.stop().await;
}
