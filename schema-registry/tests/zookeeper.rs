//! The API scenarios of tests/api.rs on a real ZooKeeper server (Debian's package, started by
//! fjord-testkit on a free loopback port), each under its own chroot; and two registry
//! instances with their own ZooKeeper sessions: a schema registered on one is served by the
//! other, and ids allocated concurrently through both never collide.

mod support;

use fjord_coord::Store;
use support::scenarios;

async fn session(zookeeper: &fjord_testkit::ZooKeeper, chroot: &str, dir: &std::path::Path) -> Store {
    let connect = format!("{}/{chroot}", zookeeper.connect_string());
    fjord_coord::open(Some(&connect), dir).await.unwrap_or_else(|e| panic!("ZooKeeper session on {connect}: {e}"))
}

#[tokio::test]
async fn api_scenarios_and_two_instances_on_zookeeper() {
    let zookeeper = fjord_testkit::ZooKeeper::start().expect("start ZooKeeper");
    let dir = tempfile::tempdir().unwrap();
    let zk = &zookeeper;
    let path = dir.path();
    scenarios::register_lookup_and_fetch_by_subject_version_and_id(session(zk, "fetch", path).await).await;
    scenarios::request_content_types(session(zk, "content-types", path).await).await;
    scenarios::error_codes_and_rejected_requests_store_nothing(session(zk, "errors", path).await).await;
    scenarios::config_and_compatibility_endpoints(session(zk, "config", path).await).await;
    scenarios::soft_and_permanent_deletes(session(zk, "deletes", path).await).await;

    let a = session(zk, "shared", path).await;
    let b = session(zk, "shared", path).await;
    assert_ne!(a.session_id(), b.session_id(), "the instances must not share a session");
    scenarios::two_instances(a, b).await;
}
