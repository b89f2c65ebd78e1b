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

/// The ensemble goes away for a while. A broker has a retrying reader per partition and
/// topic; here 50 readers retry as fast as they can for 3 s. While no session can be
/// opened they fail at once, and the store tries to open one at most after each doubling
/// pause (250 ms up to 4 s): a handful of attempts, not one per read (a 400-partition
/// broker made ~1,000 a second and logged each). Once the ensemble is back, a read opens
/// a new session within the longest pause and sees the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ensemble_outage_fails_reads_fast_and_retries_sessions_with_backoff() {
    let mut zk = ZooKeeper::start().unwrap();
    let store = std::sync::Arc::new(
        ZooKeeperStore::connect(&format!("{}/outage", zk.connect_string()), Duration::from_secs(2)).await.unwrap(),
    );
    store.create("/kept", b"1", CreateMode::Persistent).await.unwrap();
    zk.kill().unwrap();

    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut readers = Vec::new();
    for _ in 0..50 {
        let store = store.clone();
        readers.push(tokio::spawn(async move {
            let (mut reads, mut slowest) = (0u32, Duration::ZERO);
            while tokio::time::Instant::now() < until {
                let started = tokio::time::Instant::now();
                let read = store.get("/kept").await;
                slowest = slowest.max(started.elapsed());
                assert!(matches!(read, Err(Error::ConnectionLoss | Error::SessionExpired)), "{read:?}");
                reads += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (reads, slowest)
        }));
    }
    let (mut reads, mut slowest) = (0, Duration::ZERO);
    for reader in readers {
        let (n, s) = reader.await.unwrap();
        reads += n;
        slowest = slowest.max(s);
    }
    let attempts = store.failed_reconnects();
    assert!(reads > 1_000, "the readers made only {reads} reads: the failures are not fast");
    assert!(slowest < Duration::from_secs(3), "a read took {slowest:?} to fail");
    assert!((1..=6).contains(&attempts), "{attempts} attempts to open a session for {reads} failed reads in 3 s");

    zk.restart().unwrap();
    let back = async {
        loop {
            if let Ok(Some((data, _))) = store.get("/kept").await {
                return data;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let data = tokio::time::timeout(Duration::from_secs(15), back).await.expect("a session once the ensemble is back");
    assert_eq!(data, b"1");
    assert_eq!(store.failed_reconnects(), 0);
}
