//! The cluster fixture itself, with in-process brokers on a real ZooKeeper (the
//! process mode needs the `fjord` binary and is exercised by `cli/tests/cluster.rs`).

use std::time::Duration;

use fjord_testkit::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_register_stop_and_come_back_on_their_port() {
    let mut cluster = Cluster::builder().brokers(2).start().await.unwrap();
    assert_eq!(cluster.ids(), [0, 1]);
    assert_eq!(cluster.bootstrap(), format!("{},{}", cluster.addr(0), cluster.addr(1)));
    assert!(cluster.zookeeper_connect().contains("/fjord-test-"), "a chroot of its own");
    cluster.wait_for_registered(&[0, 1], Duration::from_secs(10)).await.unwrap();

    cluster.stop(1).await.unwrap();
    assert!(!cluster.is_running(1));
    cluster.wait_for_registered(&[0], Duration::from_secs(10)).await.unwrap();
    assert!(cluster.kill(0).await.is_err(), "kill -9 needs broker processes");
    assert!(cluster.pause(0).is_err(), "SIGSTOP needs broker processes");

    cluster.start(1).await.unwrap();
    cluster.wait_for_registered(&[0, 1], Duration::from_secs(10)).await.unwrap();
    assert!(cluster.start(1).await.is_err(), "broker 1 is already running");
    assert!(cluster.data_dir(1).join("meta.properties").exists(), "same data dir as before");
}

#[tokio::test]
async fn a_bad_config_key_fails_before_anything_starts() {
    let error = Cluster::builder().config("no.such.key", 1).start().await.err().expect("refused");
    assert!(format!("{error:#}").contains("no.such.key"), "{error:#}");
}
