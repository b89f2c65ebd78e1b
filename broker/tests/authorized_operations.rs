//! "Authorized operations" (KIP-430), librdkafka test 0081's DescribeTopics,
//! DescribeCluster and DescribeConsumerGroups "with authorized operations": asked for,
//! Metadata (v8+, the cluster's up to v10), DescribeCluster and DescribeGroups (v3+)
//! answer Kafka's bit field of what the client may do; without an authorizer that is
//! every operation the resource type has. Not asked for, the field is i32::MIN.

mod common;

use common::{RawClient, TestBroker};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

/// The bit field of Kafka operation codes.
fn bits(codes: &[i32]) -> i32 {
    codes.iter().fold(0, |b, c| b | 1 << c)
}
// READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9,
// DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12.
const TOPIC_OPS: &[i32] = &[3, 4, 5, 6, 7, 8, 10, 11];
const GROUP_OPS: &[i32] = &[3, 6, 8];
const CLUSTER_OPS: &[i32] = &[5, 7, 8, 9, 10, 11, 12];

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_owned())
}

#[tokio::test]
async fn authorized_operations_are_answered_when_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();

    let metadata = |include: bool| {
        MetadataRequest::default()
            .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(TopicName(s("ops"))))]))
            .with_allow_auto_topic_creation(true)
            .with_include_topic_authorized_operations(include)
            .with_include_cluster_authorized_operations(include)
    };
    let asked: MetadataResponse = client.call(ApiKey::Metadata, 10, &metadata(true)).await.unwrap();
    assert_eq!(asked.topics[0].error_code, 0);
    assert_eq!(asked.topics[0].topic_authorized_operations, bits(TOPIC_OPS));
    assert_eq!(asked.cluster_authorized_operations, bits(CLUSTER_OPS));
    let not_asked: MetadataResponse = client.call(ApiKey::Metadata, 10, &metadata(false)).await.unwrap();
    assert_eq!(not_asked.topics[0].topic_authorized_operations, i32::MIN);
    assert_eq!(not_asked.cluster_authorized_operations, i32::MIN);
    // v11+ has no cluster field; the topics' is still answered.
    let v12 = metadata(true).with_include_cluster_authorized_operations(false);
    let v12: MetadataResponse = client.call(ApiKey::Metadata, 12, &v12).await.unwrap();
    assert_eq!(v12.topics[0].topic_authorized_operations, bits(TOPIC_OPS));

    let cluster = |include: bool| DescribeClusterRequest::default().with_include_cluster_authorized_operations(include);
    let asked: DescribeClusterResponse = client.call(ApiKey::DescribeCluster, 1, &cluster(true)).await.unwrap();
    assert_eq!(asked.cluster_authorized_operations, bits(CLUSTER_OPS));
    let not_asked: DescribeClusterResponse = client.call(ApiKey::DescribeCluster, 1, &cluster(false)).await.unwrap();
    assert_eq!(not_asked.cluster_authorized_operations, i32::MIN);

    // A group that exists (a committed offset), and one that does not.
    let commit =
        OffsetCommitRequest::default().with_group_id(GroupId(s("g"))).with_generation_id_or_member_epoch(-1).with_topics(vec![
            offset_commit_request::OffsetCommitRequestTopic::default().with_name(TopicName(s("ops"))).with_partitions(vec![
                offset_commit_request::OffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(0),
            ]),
        ]);
    let committed: OffsetCommitResponse = client.call(ApiKey::OffsetCommit, 7, &commit).await.unwrap();
    assert_eq!(committed.topics[0].partitions[0].error_code, 0);
    let describe = |include: bool| {
        DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(s("g")), GroupId(s("never"))])
            .with_include_authorized_operations(include)
    };
    let asked: DescribeGroupsResponse = client.call(ApiKey::DescribeGroups, 5, &describe(true)).await.unwrap();
    assert_eq!(asked.groups[0].error_code, 0);
    assert_eq!(asked.groups[0].authorized_operations, bits(GROUP_OPS));
    let not_asked: DescribeGroupsResponse = client.call(ApiKey::DescribeGroups, 5, &describe(false)).await.unwrap();
    assert_eq!(not_asked.groups[0].authorized_operations, i32::MIN);
    broker.stop().await.unwrap();
}
