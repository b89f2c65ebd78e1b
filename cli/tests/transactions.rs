//! `fjord transactions list|describe` as a user runs them, against an in-process broker
//! and a fjord-client transactional producer with a transaction open.

mod common;

use fjord_client::{ClientConfig, Producer, ProducerConfig, ProducerRecord};
use fjord_testkit::StandaloneBroker;

use common::fjord;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_describe_show_an_open_transaction() {
    let broker = StandaloneBroker::start().await.expect("broker starts");
    let config = ProducerConfig {
        client: ClientConfig::new(&broker.addr),
        transactional_id: Some("cli-tx".into()),
        ..ProducerConfig::default()
    };
    let producer = Producer::connect(config).await.unwrap();
    producer.begin_transaction().unwrap();
    producer.send(ProducerRecord::new("cli-out", "v").partition(0)).await.unwrap().await.unwrap();
    let bootstrap = format!("--bootstrap={}", broker.addr);

    let list = fjord(&["transactions", &bootstrap, "list"]).await;
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    assert!(text.lines().any(|l| l.starts_with("cli-tx\t") && l.contains("\tOngoing\t")), "{text}");

    let describe = fjord(&["transactions", &bootstrap, "describe", "cli-tx"]).await;
    let text = String::from_utf8_lossy(&describe.stdout);
    assert!(describe.status.success(), "{}", String::from_utf8_lossy(&describe.stderr));
    assert!(text.contains("state Ongoing"), "{text}");
    assert!(text.lines().any(|l| l == "cli-out\t0"), "{text}");

    producer.commit_transaction().await.unwrap();
    let describe = fjord(&["transactions", &bootstrap, "describe", "cli-tx"]).await;
    let text = String::from_utf8_lossy(&describe.stdout);
    assert!(text.contains("state CompleteCommit") || text.contains("state PrepareCommit"), "{text}");
    // An id nobody used: a clear error, a failing exit.
    let unknown = fjord(&["transactions", &bootstrap, "describe", "nobody"]).await;
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("nobody"), "{}", String::from_utf8_lossy(&unknown.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_read_committed_shows_only_committed_transactions() {
    let broker = StandaloneBroker::start().await.expect("broker starts");
    let config = ProducerConfig {
        client: ClientConfig::new(&broker.addr),
        transactional_id: Some("cli-iso".into()),
        ..ProducerConfig::default()
    };
    let producer = Producer::connect(config).await.unwrap();
    for (values, commit) in [(["aborted 1", "aborted 2"], false), (["committed 1", "committed 2"], true)] {
        producer.begin_transaction().unwrap();
        for value in values {
            drop(producer.send(ProducerRecord::new("cli-iso", value).partition(0)).await.unwrap());
        }
        match commit {
            true => producer.commit_transaction().await.unwrap(),
            false => producer.abort_transaction().await.unwrap(),
        }
    }
    let bootstrap = format!("--bootstrap={}", broker.addr);
    let consume = |isolation: &'static str| {
        let bootstrap = bootstrap.clone();
        async move {
            let args = ["consume", &bootstrap, "--topic", "cli-iso", "--from", "beginning", "--max-messages", "2"];
            common::stdout(&fjord(&[&args[..], &["--isolation-level", isolation]].concat()).await)
        }
    };
    assert_eq!(consume("read_committed").await, "committed 1\ncommitted 2\n");
    assert_eq!(consume("read_uncommitted").await, "aborted 1\naborted 2\n", "Kafka's default shows aborted records");
}
