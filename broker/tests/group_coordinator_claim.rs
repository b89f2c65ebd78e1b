//! A broker serves a group only while it holds the group's coordinator node (#21).
//!
//! The node is ephemeral: when a coordinator's metadata session expires (cut off from
//! ZooKeeper, a long pause), another broker claims the group. The chaos runs found the
//! old coordinator still serving the group from memory after that: two coordinators,
//! two generations whose members each owned every partition, and commits from both, so
//! committed offsets went backwards (`cargo xtask chaos --seed 8 --duration 1200
//! --faults partition,isolate,one-way,zk-expire,pause,kill`, commit_backwards). Here
//! the claim moves by hand, as the expiry and the other broker's claim would move it.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::RawClient;
use fjord_coord::paths;
use fjord_testkit::Cluster;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const GROUP: &str = "moved";
const NOT_COORDINATOR: i16 = 16;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

/// A commit outside any generation (a group with no members may take one).
fn commit(offset: i64) -> OffsetCommitRequest {
    OffsetCommitRequest::default().with_group_id(GroupId(s(GROUP))).with_generation_id_or_member_epoch(-1).with_topics(vec![
        offset_commit_request::OffsetCommitRequestTopic::default().with_name(TopicName(s("t"))).with_partitions(vec![
            offset_commit_request::OffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(offset),
        ]),
    ])
}

/// The group's error code and, without an error, the offset committed for t-0.
async fn committed(client: &mut RawClient) -> (i16, Option<i64>) {
    let fetch = OffsetFetchRequest::default().with_group_id(GroupId(s(GROUP))).with_topics(Some(vec![
        offset_fetch_request::OffsetFetchRequestTopic::default().with_name(TopicName(s("t"))).with_partition_indexes(vec![0]),
    ]));
    let r: OffsetFetchResponse = client.call(ApiKey::OffsetFetch, 7, &fetch).await.unwrap();
    (r.error_code, r.topics.first().and_then(|t| t.partitions.first()).map(|p| p.committed_offset))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_whose_group_was_claimed_by_another_answers_not_coordinator() {
    common::init_tracing();
    let cluster = Cluster::builder().brokers(2).start().await.unwrap();
    cluster.create_topic("t", 1, &[], Duration::from_secs(30)).await.unwrap();
    let addr = |id: i32| cluster.addr(id).parse::<SocketAddr>().unwrap();
    let mut old = RawClient::connect(addr(0)).await.unwrap();
    let mut new = RawClient::connect(addr(1)).await.unwrap();

    // Broker 0 claims the group (nobody holds it) and keeps it in memory.
    let r: OffsetCommitResponse = old.call(ApiKey::OffsetCommit, 7, &commit(10)).await.unwrap();
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    let node = paths::group_coordinator(GROUP);
    let (holder, _) = cluster.store().get(&node).await.unwrap().expect("the coordinator node");
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&holder).unwrap()["broker_id"], 0);

    // Broker 1 holds the claim now.
    cluster.store().set(&node, br#"{"broker_id":1}"#, None).await.unwrap();

    // Broker 0 must not take the commit any more, nor answer for the group.
    let r: OffsetCommitResponse = old.call(ApiKey::OffsetCommit, 7, &commit(5)).await.unwrap();
    assert_eq!(r.topics[0].partitions[0].error_code, NOT_COORDINATOR, "the old coordinator took a commit");
    assert_eq!(committed(&mut old).await.0, NOT_COORDINATOR);
    // The new coordinator has what was committed while broker 0 held the group.
    assert_eq!(committed(&mut new).await, (0, Some(10)));
    let r: OffsetCommitResponse = new.call(ApiKey::OffsetCommit, 7, &commit(12)).await.unwrap();
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    assert_eq!(committed(&mut new).await, (0, Some(12)));
}

/// Asking about groups that do not exist (DescribeGroups, OffsetFetch, Heartbeat,
/// SyncGroup, LeaveGroup) answers as Kafka does and writes nothing in the registry: each
/// such question took the group's coordinator node before, leaving a node in ZooKeeper
/// for good per made-up group id. A group that commits is claimed. (FindCoordinator
/// takes the node, and gives it up a minute later: `group::tests`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_about_made_up_groups_leave_nothing_in_the_registry() {
    const UNKNOWN_MEMBER_ID: i16 = 25;
    let cluster = Cluster::builder().brokers(1).start().await.unwrap();
    cluster.create_topic("t", 1, &[], Duration::from_secs(30)).await.unwrap();
    let mut client = RawClient::connect(cluster.addr(0).parse::<SocketAddr>().unwrap()).await.unwrap();
    for n in 0..20 {
        let g = GroupId(s(&format!("made-up-{n}")));
        let described: DescribeGroupsResponse =
            client.call(ApiKey::DescribeGroups, 5, &DescribeGroupsRequest::default().with_groups(vec![g.clone()])).await.unwrap();
        assert_eq!((described.groups[0].error_code, described.groups[0].group_state.as_str()), (0, "Dead"));
        let fetch = OffsetFetchRequest::default().with_group_id(g.clone()).with_topics(Some(vec![
            offset_fetch_request::OffsetFetchRequestTopic::default().with_name(TopicName(s("t"))).with_partition_indexes(vec![0]),
        ]));
        let fetched: OffsetFetchResponse = client.call(ApiKey::OffsetFetch, 7, &fetch).await.unwrap();
        assert_eq!((fetched.error_code, fetched.topics[0].partitions[0].committed_offset), (0, -1));
        let beat = HeartbeatRequest::default().with_group_id(g.clone()).with_member_id(s("m")).with_generation_id(1);
        let beat: HeartbeatResponse = client.call(ApiKey::Heartbeat, 3, &beat).await.unwrap();
        assert_eq!(beat.error_code, UNKNOWN_MEMBER_ID);
        let sync = SyncGroupRequest::default().with_group_id(g.clone()).with_member_id(s("m")).with_generation_id(1);
        let sync: SyncGroupResponse = client.call(ApiKey::SyncGroup, 3, &sync).await.unwrap();
        assert_eq!(sync.error_code, UNKNOWN_MEMBER_ID);
        let leave: LeaveGroupResponse = client
            .call(ApiKey::LeaveGroup, 0, &LeaveGroupRequest::default().with_group_id(g).with_member_id(s("m")))
            .await
            .unwrap();
        assert_eq!(leave.error_code, UNKNOWN_MEMBER_ID);
    }
    let groups = match cluster.store().children(paths::CONSUMERS).await {
        Ok(children) => children,
        Err(fjord_coord::Error::NoNode { .. }) => Vec::new(),
        Err(e) => panic!("{e}"),
    };
    assert!(groups.is_empty(), "registry nodes of made-up groups: {groups:?}");

    // A group that commits is claimed and keeps its offsets.
    let r: OffsetCommitResponse = client.call(ApiKey::OffsetCommit, 7, &commit(3)).await.unwrap();
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    assert_eq!(committed(&mut client).await, (0, Some(3)));
    assert!(cluster.store().get(&paths::group_coordinator(GROUP)).await.unwrap().is_some());
}
