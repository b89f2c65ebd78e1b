//! The ZooKeeper backend against a real ZooKeeper server: the same semantics the
//! embedded store's unit tests check, plus what only a real ensemble shows.

use std::time::Duration;

use fjord_coord::{create_all, delete_all, CreateMode, Error, MetadataStore, WatchEvent, ZooKeeperStore};
use fjord_testkit::ZooKeeper;

async fn connect(zk: &ZooKeeper, chroot: &str) -> ZooKeeperStore {
    ZooKeeperStore::connect(&format!("{}{chroot}", zk.connect_string()), Duration::from_secs(6)).await.unwrap()
}

#[tokio::test]
async fn zookeeper_backend_has_zookeeper_semantics() {
    let zk = ZooKeeper::start().unwrap();
    let store = connect(&zk, "/test-chroot").await;

    // create, parents, versions, compare-and-set
    assert!(matches!(store.create("/a/b", b"x", CreateMode::Persistent).await, Err(Error::NoNode { .. })));
    create_all(&store, "/a/b", b"x", CreateMode::Persistent).await.unwrap();
    assert!(matches!(store.create("/a/b", b"x", CreateMode::Persistent).await, Err(Error::NodeExists { .. })));
    let (data, stat) = store.get("/a/b").await.unwrap().unwrap();
    assert_eq!((data.as_slice(), stat.version), (&b"x"[..], 0));
    assert_eq!(store.set("/a/b", b"y", Some(0)).await.unwrap().version, 1);
    assert!(matches!(store.set("/a/b", b"z", Some(0)).await, Err(Error::BadVersion { expected: 0, actual: 1, .. })));
    assert!(matches!(store.delete("/a", None).await, Err(Error::NotEmpty { .. })));

    // sequential nodes
    let first = store.create("/a/seq-", b"", CreateMode::PersistentSequential).await.unwrap();
    let second = store.create("/a/seq-", b"", CreateMode::PersistentSequential).await.unwrap();
    assert_eq!(first, "/a/seq-0000000001"); // /a/b took cversion 0 of /a
    assert!(second > first);
    assert_eq!(store.children("/a").await.unwrap(), vec!["b".to_string(), first[3..].to_string(), second[3..].to_string()]);

    // watches
    let (none, created) = store.watch_data("/a/w").await.unwrap();
    assert!(none.is_none());
    store.create("/a/w", b"1", CreateMode::Persistent).await.unwrap();
    assert_eq!(tokio::time::timeout(Duration::from_secs(5), created).await.unwrap(), WatchEvent::Created);
    let (_, children) = store.watch_children("/a").await.unwrap();
    store.delete("/a/w", None).await.unwrap();
    assert_eq!(tokio::time::timeout(Duration::from_secs(5), children).await.unwrap(), WatchEvent::ChildrenChanged);

    // the chroot really is a chroot
    let root = connect(&zk, "/").await;
    assert!(root.get("/test-chroot/a/b").await.unwrap().is_some());
    delete_all(&store, "/a").await.unwrap();
    assert_eq!(store.get("/a").await.unwrap(), None);
}

#[tokio::test]
async fn ephemerals_vanish_with_their_session_and_others_see_it() {
    let zk = ZooKeeper::start().unwrap();
    let watcher = connect(&zk, "/fjord").await;
    create_all(&watcher, "/brokers/ids", b"", CreateMode::Persistent).await.unwrap();
    let (_, gone) = {
        let broker = connect(&zk, "/fjord").await;
        broker.create("/brokers/ids/1", b"{}", CreateMode::Ephemeral).await.unwrap();
        let watched = watcher.watch_data("/brokers/ids/1").await.unwrap();
        assert!(watched.0.is_some());
        watched
        // `broker` dropped here: its session closes.
    };
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), gone).await.unwrap(), WatchEvent::Deleted);
    assert_eq!(watcher.children("/brokers/ids").await.unwrap(), Vec::<String>::new());
}

#[tokio::test]
async fn unreachable_ensemble_fails_fast_with_a_clear_error() {
    let port = fjord_testkit::free_port().unwrap();
    let started = std::time::Instant::now();
    let result = ZooKeeperStore::connect(&format!("127.0.0.1:{port}"), Duration::from_secs(2)).await;
    assert!(matches!(result, Err(Error::ConnectionLoss)), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}
