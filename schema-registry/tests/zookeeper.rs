//! Two registry instances, each with its own session on one real ZooKeeper server (Debian's
//! package, started by fjord-testkit on a free loopback port): a schema registered on one is
//! served by the other, and ids allocated concurrently through both never collide.

mod support;

#[tokio::test]
async fn two_instances_on_one_zookeeper() {
    let zookeeper = fjord_testkit::ZooKeeper::start().expect("start ZooKeeper");
    let connect = format!("{}/registry-test", zookeeper.connect_string());
    let dir = tempfile::tempdir().unwrap();
    let a = fjord_coord::open(Some(&connect), dir.path()).await.expect("first ZooKeeper session");
    let b = fjord_coord::open(Some(&connect), dir.path()).await.expect("second ZooKeeper session");
    assert_ne!(a.session_id(), b.session_id(), "the instances must not share a session");
    support::two_instances_scenario(a, b).await;
}
