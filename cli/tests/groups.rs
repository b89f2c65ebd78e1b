//! `fjord groups list|describe|reset-offsets` as a user runs them, against an
//! in-process broker and a live fjord group member.

mod common;

use std::time::{Duration, Instant};

use fjord_client::{
    Admin, ClientConfig, GroupConfig, GroupConsumer, NewTopic, OffsetReset, Producer, ProducerConfig, ProducerRecord,
};
use fjord_testkit::StandaloneBroker;

use common::{fjord, stdout};

async fn start_broker() -> StandaloneBroker {
    StandaloneBroker::start_for_groups().await.expect("broker starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_shows_members_and_lag_and_reset_needs_an_empty_group() {
    let broker = start_broker().await;
    let client = ClientConfig::new(&broker.addr);
    Admin::connect(client.clone()).await.unwrap().create_topics(&[NewTopic::new("t", 4)]).await.unwrap();
    let producer = Producer::connect(ProducerConfig { client, ..ProducerConfig::default() }).await.unwrap();
    for i in 0..40 {
        producer.send(ProducerRecord::new("t", format!("v{i}")).partition(i % 4)).await.unwrap().await.unwrap();
    }

    let mut config = GroupConfig::new(&broker.addr, "g");
    config.consumer.auto_offset_reset = OffsetReset::Earliest;
    config.session_timeout = Duration::from_secs(2);
    config.heartbeat_interval = Duration::from_millis(300);
    config.enable_auto_commit = false;
    let mut member = GroupConsumer::subscribe(config, &["t"]).await.unwrap();
    let (mut consumed, deadline) = (0, Instant::now() + Duration::from_secs(20));
    while consumed < 30 {
        assert!(Instant::now() < deadline, "consumed only {consumed}");
        consumed += member.poll(Duration::from_millis(100)).await.unwrap().len();
    }
    member.commit_sync().await.unwrap();
    // Keep the member alive (heartbeats run in the background) while the CLI looks.
    let bootstrap = format!("--bootstrap={}", broker.addr);

    let list = stdout(&fjord(&["groups", &bootstrap, "list"]).await);
    assert!(list.lines().any(|l| l.starts_with("g\t")), "{list}");

    let describe = stdout(&fjord(&["groups", &bootstrap, "describe", "g"]).await);
    assert!(describe.contains("members 1"), "{describe}");
    assert!(describe.contains("partitions [t-0,t-1,t-2,t-3]"), "{describe}");
    assert!(describe.contains(&format!("total lag {}", 40 - consumed)), "{describe}");
    let rows = describe.lines().filter(|l| l.starts_with("t\t")).count();
    assert_eq!(rows, 4, "{describe}");

    let refused = fjord(&["groups", &bootstrap, "reset-offsets", "g", "--topic", "t", "--to-earliest"]).await;
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("active member"), "{err}");

    member.close().await.unwrap();
    let reset = stdout(&fjord(&["groups", &bootstrap, "reset-offsets", "g", "--topic", "t", "--to-earliest"]).await);
    assert_eq!(reset.lines().count(), 4, "{reset}");
    let describe = stdout(&fjord(&["groups", &bootstrap, "describe", "g"]).await);
    assert!(describe.contains("members 0") && describe.contains("total lag 40"), "{describe}");

    stdout(&fjord(&["groups", &bootstrap, "reset-offsets", "g", "--topic", "t", "--to-offset", "7"]).await);
    let describe = stdout(&fjord(&["groups", &bootstrap, "describe", "g"]).await);
    assert!(describe.contains("total lag 12"), "{describe}");
}
