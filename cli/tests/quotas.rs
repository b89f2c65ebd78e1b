//! `fjord quotas describe|alter` as a user runs them (kafka-configs style), against an
//! in-process broker: the quota it sets is the one the broker stores and describes.

mod common;

use fjord_testkit::StandaloneBroker;

use common::{fjord, stdout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_are_set_described_and_removed() {
    let broker = StandaloneBroker::start().await.expect("broker starts");
    let bootstrap = format!("--bootstrap={}", broker.addr);

    let set =
        fjord(&["quotas", &bootstrap, "alter", "--user", "alice", "--add", "producer_byte_rate=5242880,request_percentage=50"])
            .await;
    assert!(stdout(&set).contains("Completed updating quota configs for user 'alice'"));
    let set = fjord(&["quotas", &bootstrap, "alter", "--client-default", "--consumer-byte-rate", "1048576"]).await;
    stdout(&set);
    // validate_only stores nothing.
    let checked =
        fjord(&["quotas", &bootstrap, "alter", "--client-id", "app", "--add", "producer_byte_rate=1", "--validate-only"]).await;
    assert!(stdout(&checked).contains("Validated"));

    let all = stdout(&fjord(&["quotas", &bootstrap, "describe"]).await);
    assert_eq!(
        all.lines().collect::<Vec<_>>(),
        [
            "Quota configs for client-id '<default>' are consumer_byte_rate=1048576",
            "Quota configs for user 'alice' are producer_byte_rate=5242880, request_percentage=50.0",
        ],
        "{all}"
    );
    // Kafka's flag spelling, after the action.
    let alice = stdout(&fjord(&["quotas", "describe", "--user", "alice", "--bootstrap-server", &broker.addr]).await);
    assert_eq!(alice.trim(), "Quota configs for user 'alice' are producer_byte_rate=5242880, request_percentage=50.0");

    // Bad input: Kafka's error, a failing exit, nothing stored.
    let bad = fjord(&["quotas", &bootstrap, "alter", "--user", "bob", "--add", "producer_byte_rate=-1"]).await;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("positive"), "{}", String::from_utf8_lossy(&bad.stderr));
    let unknown = fjord(&["quotas", &bootstrap, "alter", "--user", "bob", "--add", "fetch_rate=1"]).await;
    assert!(!unknown.status.success());
    let bob = stdout(&fjord(&["quotas", &bootstrap, "describe", "--user", "bob"]).await);
    assert_eq!(bob.trim(), "No quota configs for user 'bob'");

    let removed = fjord(&["quotas", &bootstrap, "alter", "--user", "alice", "--delete", "request_percentage"]).await;
    stdout(&removed);
    let alice = stdout(&fjord(&["quotas", &bootstrap, "describe", "--user", "alice"]).await);
    assert_eq!(alice.trim(), "Quota configs for user 'alice' are producer_byte_rate=5242880");
    broker.stop().await.unwrap();
}
