//! Credentials and ACLs through the metadata store, on both backends: an ACL change made
//! through one store handle reaches every watcher (broker) within two seconds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fjord_auth::acl::{AccessControlEntryFilter, PatternTypeFilter, ResourcePatternFilter};
use fjord_auth::{
    store, AccessControlEntry, AclBinding, AclBindingFilter, AclWatcher, AuthorizerConfig, Operation, PatternType, Permission,
    Principal, Resource, ResourcePattern, ResourceType, ScramCredential, ScramMechanism, ScramServer,
};
use fjord_coord::{EmbeddedStore, Store, ZooKeeperStore};
use fjord_testkit::{wait_until, ZooKeeper};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How soon every broker must enforce a change (issue #19).
const PROPAGATION: Duration = Duration::from_secs(2);

fn binding(principal: &str, operation: Operation, permission: Permission, name: &str, pattern_type: PatternType) -> AclBinding {
    AclBinding {
        pattern: ResourcePattern::new(ResourceType::Topic, name, pattern_type).unwrap(),
        entry: AccessControlEntry::new(principal.parse().unwrap(), "*", operation, permission).unwrap(),
    }
}

async fn everywhere(watchers: &[Arc<AclWatcher>], what: &str, check: impl Fn(&AclWatcher) -> bool) -> Duration {
    let started = Instant::now();
    wait_until(PROPAGATION, what, || {
        let all = watchers.iter().all(|w| check(w));
        async move { Ok(all.then_some(())) }
    })
    .await
    .unwrap();
    started.elapsed()
}

/// The scenario, written once: `writer` makes the changes, each of `brokers` runs a watcher.
async fn acls_and_credentials_reach_every_broker(writer: Store, brokers: Vec<Store>) {
    let tracker = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let alice = Principal::user("alice");
    let bob = Principal::user("bob");

    // Stored before the brokers start: loaded by start().
    store::create_acls(&*writer, &[binding("User:alice", Operation::Read, Permission::Allow, "orders", PatternType::Literal)])
        .await
        .unwrap();
    let config = AuthorizerConfig { super_users: vec![Principal::user("admin")], allow_everyone_if_no_acl_found: false };
    let mut watchers = Vec::new();
    for broker in brokers {
        watchers.push(AclWatcher::start(broker, config.clone(), &tracker, shutdown.clone()).await.unwrap());
    }
    for w in &watchers {
        assert!(w.authorize(&alice, "10.0.0.1", Operation::Read, Resource::topic("orders")));
        assert!(w.authorize(&alice, "10.0.0.1", Operation::Describe, Resource::topic("orders")));
        assert!(!w.authorize(&bob, "10.0.0.1", Operation::Read, Resource::topic("orders")));
    }

    store::create_acls(&*writer, &[binding("User:bob", Operation::Write, Permission::Allow, "pay", PatternType::Prefixed)])
        .await
        .unwrap();
    let took = everywhere(&watchers, "bob's prefixed Write ACL", |w| {
        w.authorize(&bob, "10.0.0.2", Operation::Write, Resource::topic("payments"))
    })
    .await;
    println!("an added ACL reached {} watchers in {took:?}", watchers.len());

    store::create_acls(&*writer, &[binding("User:*", Operation::All, Permission::Deny, "orders", PatternType::Literal)])
        .await
        .unwrap();
    everywhere(&watchers, "the deny on orders", |w| !w.authorize(&alice, "10.0.0.1", Operation::Read, Resource::topic("orders")))
        .await;
    assert!(watchers.iter().all(|w| w.authorize(&Principal::user("admin"), "h", Operation::Delete, Resource::topic("orders"))));

    let mut by_bob = AclBindingFilter::any();
    by_bob.entry = AccessControlEntryFilter { principal: Some(bob.clone()), ..Default::default() };
    let deny_on_orders = AclBindingFilter {
        pattern: ResourcePatternFilter {
            resource_type: Some(ResourceType::Topic),
            name: Some("orders".into()),
            pattern_type: PatternTypeFilter::Match,
        },
        entry: AccessControlEntryFilter { permission: Some(Permission::Deny), ..Default::default() },
    };
    let deleted = store::delete_acls(&*writer, &[by_bob, deny_on_orders]).await.unwrap();
    assert_eq!((deleted[0].len(), deleted[1].len()), (1, 1));
    let took = everywhere(&watchers, "the deletions", |w| {
        !w.authorize(&bob, "10.0.0.2", Operation::Write, Resource::topic("payments"))
            && w.authorize(&alice, "10.0.0.1", Operation::Read, Resource::topic("orders"))
    })
    .await;
    println!("deletions reached {} watchers in {took:?}", watchers.len());
    assert_eq!(watchers[0].authorizer().acls().len(), 1);

    // A credential written through one handle authenticates through another.
    let credential = ScramCredential::generate(ScramMechanism::Sha512, "s3cret", 4096).unwrap();
    store::set_credential(&*writer, "alice", ScramMechanism::Sha512, &credential).await.unwrap();
    let mut exchange = ScramServer::new(ScramMechanism::Sha512);
    let user = exchange.client_first(b"n,,n=alice,r=abc").unwrap();
    assert_eq!(store::credential(&*writer, &user, ScramMechanism::Sha512).await.unwrap(), Some(credential));
    assert_eq!(store::list_users(&*writer).await.unwrap()["alice"][&ScramMechanism::Sha512], 4096);

    shutdown.cancel();
    tracker.close();
    tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await.expect("watchers stop at shutdown");
}

#[tokio::test]
async fn embedded_store_acls_and_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let store: Store = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
    acls_and_credentials_reach_every_broker(store.clone(), vec![store]).await;
}

#[tokio::test]
async fn zookeeper_acls_and_credentials_reach_every_broker() {
    let zk = ZooKeeper::start().unwrap();
    let connect = format!("{}/fjord-auth-test", zk.connect_string());
    let open = || async { Arc::new(ZooKeeperStore::connect(&connect, Duration::from_secs(6)).await.unwrap()) as Store };
    let writer = open().await;
    let brokers = vec![open().await, open().await, open().await];
    acls_and_credentials_reach_every_broker(writer, brokers).await;
}

/// Concurrent CreateAcls on one pattern through several ZooKeeper sessions (brokers):
/// the compare-and-set retries keep every entry, none overwrites another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_on_one_pattern_lose_nothing() {
    let zk = ZooKeeper::start().unwrap();
    let connect = format!("{}/fjord-auth-race", zk.connect_string());
    let mut handles = Vec::new();
    for _ in 0..3 {
        handles.push(Arc::new(ZooKeeperStore::connect(&connect, Duration::from_secs(6)).await.unwrap()) as Store);
    }
    let mut writers = tokio::task::JoinSet::new();
    for i in 0..24 {
        let store = handles[i % handles.len()].clone();
        writers.spawn(async move {
            let acl = binding(&format!("User:u{i}"), Operation::Read, Permission::Allow, "shared", PatternType::Literal);
            store::create_acls(&*store, &[acl]).await
        });
    }
    while let Some(written) = writers.join_next().await {
        written.unwrap().unwrap();
    }
    let pattern = ResourcePattern::new(ResourceType::Topic, "shared", PatternType::Literal).unwrap();
    assert_eq!(store::read_pattern(&*handles[0], &pattern).await.unwrap().len(), 24);
}
