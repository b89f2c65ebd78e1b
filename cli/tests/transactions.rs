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
